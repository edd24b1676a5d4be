"""Rollout: spreading generation over rollout workers (the scheduler core grows here)."""
