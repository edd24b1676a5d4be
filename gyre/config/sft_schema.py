"""The config of a standalone supervised fine-tuning run (``gyre sft``).

The ``sft`` section is the one an RL run's ``sft_warmup`` takes; ``model``, ``cluster`` and ``watchdog``
are the RL config's sections; ``policy`` places the trainer ranks. The run writes ``metrics.jsonl`` and a
Hugging Face model in ``run.output_dir/final_model``, as ``gyre train`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gyre.config.base import DeviceList, NonNegInt, StrictModel
from gyre.config.schema import ClusterConfig, ModelConfig, SFTConfig, WatchdogConfig


class SFTRunSection(StrictModel):
    name: str = "gyre-sft"
    output_dir: Path = Path("runs/gyre-sft")
    """Receives metrics.jsonl, tensorboard/ and final_model/ (a directory that holds a run is refused
    unless --overwrite moves that run aside)."""
    seed: NonNegInt = 0
    """Seeds the example order and the trainer ranks."""


class SFTPolicySection(StrictModel):
    """Where the trainer ranks run: one data-parallel rank per device."""

    devices: DeviceList = (0,)
    strategy: Literal["ddp", "fsdp2"] = "ddp"


class SFTLoggingSection(StrictModel):
    tensorboard: bool = True
    progress: bool = True


class SFTJobConfig(StrictModel):
    """A standalone SFT run: the policy trainer on chat or (prompt, response) data, then its final model."""

    pipeline: Literal["sft"] = "sft"
    run: SFTRunSection = SFTRunSection()
    cluster: ClusterConfig = ClusterConfig()
    watchdog: WatchdogConfig = WatchdogConfig()
    model: ModelConfig
    policy: SFTPolicySection = SFTPolicySection()
    sft: SFTConfig
    logging: SFTLoggingSection = SFTLoggingSection()
