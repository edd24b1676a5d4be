"""Rollout engines (HF today) and the trainer backend (DDP / FSDP2), behind small protocols."""
