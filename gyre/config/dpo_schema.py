"""The config of a standalone preference-optimisation run (``gyre dpo``): DPO and its variants.

``model``, ``cluster`` and ``watchdog`` are the RL config's sections; ``run``, ``policy`` and ``logging`` are
``gyre sft``'s; the ``dpo`` section holds the pairwise data, the loss variant (TRL's ``loss_type`` names)
and the optimisation. The run writes ``metrics.jsonl`` and a Hugging Face model in
``run.output_dir/final_model``, as ``gyre sft`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from gyre.algos.specs import PreferenceLossSpec, PreferenceLossType
from gyre.config.base import PositiveFloat, PositiveInt, StrictModel
from gyre.config.data_schema import DataSource
from gyre.config.schema import ClusterConfig, ModelConfig, OptimizerConfig, SchedulerConfig, WatchdogConfig
from gyre.config.sft_schema import SFTLoggingSection, SFTPolicySection, SFTRunSection
from gyre.config.train_schema import describe_length, one_length, total_steps


class DPOConfig(StrictModel):
    """Pairwise preference data and the loss: each step draws ``batch_size`` pairs and takes one optimizer
    step of the mean per-pair loss (``gyre.algos.preference``) over all of them."""

    train_files: list[DataSource]
    """Files, directories, globs or {dataset: ...} entries, as for data.train_files; rows in TRL's preference
    formats: prompt/chosen/rejected as texts or chats, or chosen/rejected conversations sharing their prompt."""
    prompt_key: str = "prompt"
    """The column holding the prompt (a text or a chat); a row without it takes the shared beginning of its
    chosen and rejected conversations as the prompt."""
    chosen_key: str = "chosen"
    """The column holding the preferred completion: a text, or a list of assistant messages (or a whole
    conversation, without a prompt column)."""
    rejected_key: str = "rejected"
    """The column holding the dispreferred completion, in the chosen one's form."""
    system_prompt: str | None = None
    """A system message put before every chat prompt that has none."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra arguments of apply_chat_template (e.g. {enable_thinking: false})."""
    loss_type: PreferenceLossType = "sigmoid"
    """sigmoid (DPO; with label_smoothing, cDPO), ipo, hinge (SLiC), robust (robust DPO), simpo (SimPO:
    no reference model); TRL's names."""
    beta: PositiveFloat = 0.1
    """Inverse temperature of the implicit reward: larger keeps the policy closer to the reference (IPO: 1/beta
    is the target margin; SimPO's paper uses 2.0 to 2.5)."""
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    """The assumed fraction of flipped preference labels (sigmoid: cDPO; robust; simpo)."""
    simpo_gamma: float = 0.5
    """SimPO's target reward margin (loss_type simpo only)."""
    rpo_alpha: Annotated[float, Field(ge=0.0)] | None = None
    """Weight of an NLL term on the chosen completions (RPO, per token); None leaves it out (TRL's rpo_alpha)."""
    steps: PositiveInt | None = None
    """Optimizer steps of the run (default 100 when epochs is not set either); give steps or epochs."""
    epochs: PositiveFloat | None = None
    """Passes over the pairs instead of steps (TRL's num_train_epochs; 1.5 works): the run takes
    ceil(epochs x pairs / batch_size) optimizer steps, computed once the data is loaded and printed."""
    batch_size: PositiveInt = 32
    """Pairs per optimizer step across all ranks (a multiple of the policy devices)."""
    micro_batch_size: PositiveInt = 4
    """Pairs per forward/backward on one rank (2 rows each: a pair's chosen and rejected sequences)."""
    optimizer: OptimizerConfig = OptimizerConfig(lr=1e-6)
    """AdamW; the default learning rate is TRL's DPO default."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """Learning-rate schedule over the steps."""
    grad_clip: PositiveFloat | None = 1.0
    """Clip the gradient's global norm to this; None does not clip."""
    max_tokens: PositiveInt = 1024
    """The longest sequence (prompt + completion) of a pair, in tokens (TRL's max_length)."""
    overlong: Literal["error", "drop", "truncate"] = "error"
    """Pairs over max_tokens: error stops at load time naming the first; drop leaves them out; truncate cuts
    each sequence to its first max_tokens tokens (both counted)."""

    @model_validator(mode="after")
    def _valid(self) -> DPOConfig:
        one_length(self, "DPO")
        self.loss_spec()
        return self

    def total_steps(self, pairs: int) -> int:
        """The run's optimizer steps over ``pairs`` pairs: ``steps``, or ``epochs`` passes rounded up."""
        return total_steps(self, pairs)

    def describe_length(self, pairs: int, unit: str = "pairs") -> str:
        return describe_length(self, pairs, unit)

    def loss_spec(self) -> PreferenceLossSpec:
        """The pure loss function's spec (``gyre.algos.preference``)."""
        return PreferenceLossSpec(self.loss_type, self.beta, self.label_smoothing, self.simpo_gamma, self.rpo_alpha)


class DPOJobConfig(StrictModel):
    """A standalone DPO run: the reference log-probs of every pair, then the policy trainer on the pairs,
    then its final model."""

    pipeline: Literal["dpo"] = "dpo"
    """Which pipeline this config is for (always dpo)."""
    run: SFTRunSection = SFTRunSection(name="gyre-dpo", output_dir=Path("runs/gyre-dpo"))
    """Name, output directory and seed (of the pair order and the trainer ranks)."""
    cluster: ClusterConfig = ClusterConfig()
    """The Ray cluster (as for gyre train)."""
    watchdog: WatchdogConfig = WatchdogConfig()
    """Deadlines on calls to the reference and trainer ranks (as for gyre train)."""
    model: ModelConfig
    """The model to train, and the reference (its starting weights)."""
    policy: SFTPolicySection = SFTPolicySection()
    """Where the trainer ranks run (the reference runs on the same devices first), and LoRA."""
    dpo: DPOConfig
    """The pairs, the loss variant, steps and batch sizes."""
    logging: SFTLoggingSection = SFTLoggingSection()
    """TensorBoard and progress output."""
