"""The config of a standalone supervised fine-tuning run (``gyre sft``).

The ``sft`` section is the one an RL run's ``sft_warmup`` takes; ``model``, ``cluster`` and ``watchdog``
are the RL config's sections; ``policy`` places the trainer ranks. The run writes ``metrics.jsonl`` and a
Hugging Face model in ``run.output_dir/final_model``, as ``gyre train`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gyre.config.base import DeviceList, NonNegInt, PositiveInt, StrictModel
from gyre.config.logging_schema import SFTLoggingSection
from gyre.config.schema import ClusterConfig, LoraConfig, ModelConfig, SFTConfig, WatchdogConfig
from gyre.engines.specs import MemoryLevers, RemovePadding


class SFTRunSection(StrictModel):
    name: str = "gyre-sft"
    """The run's name (logs, TensorBoard)."""
    output_dir: Path = Path("runs/gyre-sft")
    """Receives metrics.jsonl, tensorboard/ and final_model/ (a directory that holds a run is refused
    unless --overwrite moves that run aside)."""
    seed: NonNegInt = 0
    """Seeds the example order and the trainer ranks."""


class SFTPolicySection(StrictModel):
    """Where the trainer ranks of gyre sft and gyre dpo run (one data-parallel rank per device), and LoRA."""

    devices: DeviceList = (0,)
    """Devices of the trainer ranks (GPU indices, or CPU slots)."""
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    """ddp: a whole model per rank; fsdp2: parameters, gradients and optimizer state sharded over the ranks."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight (``{}`` turns it on with its defaults); the run ends with
    final_model/ (merged) and final_adapter/ as lora.save says."""
    remove_padding: RemovePadding = "none"
    """As gyre train's policy.remove_padding: none, sort (gyre sft: rows ordered by length before the
    micro-batches are cut; gyre dpo keeps whole pairs in order, so sort changes nothing there) or pack (each
    micro-batch's rows concatenated into one sequence, no padding at all). Rows that already hold packed
    examples (sft.packing) keep their own layout."""
    logprob_chunk_tokens: PositiveInt | None = None
    """As gyre train's policy.logprob_chunk_tokens: log-probs from the final hidden states this many tokens
    at a time, so the full [tokens, vocabulary] logits never exist at once (also in gyre dpo's reference
    pass). None: all logits at once."""

    @property
    def levers(self) -> MemoryLevers:
        """The levers as the engines take them (micro-batches stay by row or pair count)."""
        return MemoryLevers(None, self.remove_padding, self.logprob_chunk_tokens)


class SFTJobConfig(StrictModel):
    """A standalone SFT run: the policy trainer on chat or (prompt, response) data, then its final model."""

    pipeline: Literal["sft"] = "sft"
    """Which pipeline this config is for (always sft)."""
    run: SFTRunSection = SFTRunSection()
    """Name, output directory and seed."""
    cluster: ClusterConfig = ClusterConfig()
    """The Ray cluster (as for gyre train)."""
    watchdog: WatchdogConfig = WatchdogConfig()
    """Deadlines on calls to the trainer ranks (as for gyre train)."""
    model: ModelConfig
    """The model to fine-tune (as for gyre train)."""
    policy: SFTPolicySection = SFTPolicySection()
    """Where the trainer ranks run."""
    sft: SFTConfig
    """The data, steps and batch sizes (the section an RL run's sft_warmup takes)."""
    logging: SFTLoggingSection = SFTLoggingSection()
    """Experiment trackers and progress output."""
