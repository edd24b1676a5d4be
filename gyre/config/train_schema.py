"""The trainer roles' config sections: the policy, critic and reference (placement, optimizer, schedule,
LoRA and memory levers) and supervised fine-tuning (``sft_warmup`` and ``gyre sft``)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import model_validator

from gyre.config.base import (
    DeviceList,
    PositiveFloat,
    PositiveInt,
    StrictModel,
    section_from_spec,
)
from gyre.config.data_schema import DataSource
from gyre.engines.specs import MemoryLevers, OptimizerSpec, RemovePadding, SchedulerSpec
from gyre.models.specs import LoraSpec

OptimizerConfig = section_from_spec(OptimizerSpec, "OptimizerConfig", __name__)
SchedulerConfig = section_from_spec(SchedulerSpec, "SchedulerConfig", __name__)
LoraConfig = section_from_spec(LoraSpec, "LoraConfig", __name__)
"""``policy.lora``: the fields of ``gyre.models.specs.LoraSpec`` (declared and documented there)."""


class ForwardLevers(StrictModel):
    """How a model role cuts its work into forward passes, and the memory levers of those passes. Each
    lever computes the same log-probs, losses and gradients as the plain path (micro-batches are scaled
    by the optimizer step's global denominators, never by their own size)."""

    micro_batch_size: PositiveInt = 8
    """Samples per forward (and backward) pass on one rank when micro_batch_tokens is unset; gradients
    accumulate over micro-batches."""
    micro_batch_tokens: PositiveInt | None = None
    """Cut micro-batches by this token budget instead of micro_batch_size rows (verl's
    ppo_max_token_len_per_gpu): rows are added while the micro-batch stays within it, padding counted
    (rows x the longest row) unless remove_padding is pack (the sum of the rows); a longer row goes alone.
    None: by row count."""
    remove_padding: RemovePadding = "none"
    """none: micro-batches of consecutive rows, right-padded to the longest. sort: rows ordered longest
    first before cutting, so each micro-batch holds rows of similar length and little padding. pack: rows
    ordered so too, and each micro-batch's rows concatenated into one sequence with no padding at all
    (position ids restart per row). Attention stays within a row through a dense block-diagonal mask
    under eager and sdpa, which grows with the square of the packed length, so there a packed micro-batch
    also stays within 4096 tokens when micro_batch_tokens is unset; a block-sparse mask under
    flex_attention and flash-attention's variable-length path under flash_attention_2/3 cost about what
    the rows alone cost, with no such cap. model.attn_implementation unset on GPUs picks one of those two
    (gyre check prints the path)."""
    logprob_chunk_tokens: PositiveInt | None = None
    """Compute log-probs (and entropies) from the final hidden states this many tokens at a time, so the
    full [tokens, vocabulary] float32 logits never exist at once; in training each chunk's logits are
    recomputed in the backward pass. Needs a model that returns its output layer's logits unchanged
    (checked at load). E.g. 1024; None: all logits at once. Policy and reference only."""

    @property
    def levers(self) -> MemoryLevers:
        """The levers as the engines take them."""
        return MemoryLevers(self.micro_batch_tokens, self.remove_padding, self.logprob_chunk_tokens)


class PolicyConfig(ForwardLevers):
    """The policy trainer: one data-parallel rank per device, its optimizer and its memory levers."""

    devices: DeviceList = (0,)
    """Devices of the trainer ranks, one rank each (GPU indices, or CPU slots); a list shared with another
    role time-shares those devices (colocated), a disjoint one runs beside it."""
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    """ddp: a whole model per rank; fsdp2: parameters, gradients and optimizer state sharded over the ranks."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """AdamW's settings."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """The learning rate schedule over the run's optimizer steps."""
    grad_clip: PositiveFloat | None = 1.0
    """Clip the global gradient norm (over all ranks) to this value before each optimizer step; None: no clip."""
    mini_batch_size: PositiveInt | None = None
    """Samples per optimizer step, across all data-parallel ranks; None is the whole rollout batch."""
    epochs: PositiveInt = 1
    """Passes over each rollout batch."""
    offload: Literal["auto", "always", "never"] = "auto"
    """Offload idle state of roles that share a device: auto offloads on GPU, never on CPU."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight (``{}`` turns it on with its defaults; see LoraConfig)."""


class CriticConfig(ForwardLevers):
    """The value model of PPO (algorithm.advantage.estimator gae): a value head on a copy of the backbone."""

    model_path: str | None = None
    """Where the critic's backbone comes from (a local directory or a cached Hub id, as model.path);
    default model.path."""
    devices: DeviceList = (0,)
    """Devices of the critic's ranks (one data-parallel rank each), placed like policy.devices."""
    strategy: Literal["ddp", "fsdp2"] = "ddp"
    """ddp or fsdp2, as for the policy."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """The critic's own AdamW."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """The critic's learning rate schedule."""
    grad_clip: PositiveFloat | None = 1.0
    """Clip the critic's global gradient norm to this value; None: no clip."""
    num_critics: PositiveInt = 1
    """M critics (AsyPPO, arXiv 2510.01656): each its own model copy, optimizer and ranks (one per device of
    ``devices``, the critics time-sharing them), trained on a disjoint share of every batch
    (algorithm.critic.data_division). GAE uses their aggregated value (algorithm.critic.value_aggregation);
    their disagreement drives algorithm.critic.adv_mask_low_pct and entropy_filter_high_pct. 1 is PPO's single
    critic."""

    @model_validator(mode="after")
    def _no_vocabulary(self) -> CriticConfig:
        if self.logprob_chunk_tokens is not None:
            raise ValueError("critic.logprob_chunk_tokens: the critic outputs one value per token, not a "
                             "distribution over the vocabulary, so there are no log-probs to chunk; remove it")
        return self


class ReferenceConfig(ForwardLevers):
    """The frozen reference model of the KL term (created only when a KL coefficient asks for it)."""

    devices: DeviceList = (0,)
    """Devices of the reference workers (one each), placed like policy.devices."""
    micro_batch_size: PositiveInt = 16
    """Samples per forward pass on one worker when micro_batch_tokens is unset."""


class TeacherConfig(ForwardLevers):
    """The frozen teacher of on-policy distillation (created only when algorithm.distill.coef > 0): a
    model scoring the student's samples token by token, placed and time-shared like the reference."""

    model_path: str | None = None
    """The teacher's model: a local Hugging Face model directory or a cached Hub id, as model.path. It must
    use the student's tokenizer (the same token ids; checked before the run starts); its size and
    architecture may differ. Required when distilling."""
    devices: DeviceList = (0,)
    """Devices of the teacher workers (one each); a list shared with another role time-shares it."""
    micro_batch_size: PositiveInt = 16
    """Samples per forward pass on one worker when micro_batch_tokens is unset."""


class SFTConfig(StrictModel):
    """Supervised fine-tuning: the warm-up before RL (``sft_warmup``) or a standalone run (``gyre sft``).

    A row is a (prompt, response) pair, trained on the response and an EOS token (a response given as
    assistant messages is trained as the chat template writes them); a conversation (a chat in
    ``messages_key`` and no response column), trained on every assistant message as the tokenizer's chat
    template writes it (its end-of-turn marker included) and on nothing else; or a plain text
    (``text_key``, TRL's language-modeling layout), trained on every token. TRL's and ShareGPT's column
    names are found under the default keys (``completion``, ``conversations``)."""

    train_files: list[DataSource]
    """Files, directories, globs or {dataset: ...} entries, as for data.train_files."""
    prompt_key: str = "prompt"
    """The column holding a pair's prompt: a text, or a chat (a list of {"role", "content"})."""
    response_key: str = "response"
    """The column holding a pair's target: a text, or assistant messages (TRL's conversational
    prompt-completion). Left at "response", a ``completion`` column (TRL's name) is read when there is no
    ``response``. A row without it is a conversation or a text."""
    messages_key: str = "messages"
    """The column holding a conversation: a chat whose assistant messages are the targets (TRL's
    conversational format; ShareGPT's {"from", "value"} messages too, found in ``conversations`` when left
    at "messages"); a pair row may hold its chat prompt here instead of in prompt_key."""
    text_key: str = "text"
    """The column holding a plain text trained whole, plus EOS (TRL's language-modeling layout), for rows with
    neither a response nor a conversation."""
    system_prompt: str | None = None
    """A system message put before every chat that has none (gyre sft; an sft_warmup uses data.system_prompt)."""
    chat_template_kwargs: dict[str, Any] = {}
    """Extra arguments of apply_chat_template (gyre sft; an sft_warmup uses data.chat_template_kwargs)."""
    steps: PositiveInt | None = None
    """Optimizer steps of the run (default 100 when epochs is not set either); give steps or epochs."""
    epochs: PositiveFloat | None = None
    """Passes over the examples instead of steps (TRL's num_train_epochs; 1.5 works): the run takes
    ceil(epochs x examples / batch_size) optimizer steps, computed once the data is loaded and printed."""
    batch_size: PositiveInt = 32
    """Examples per optimizer step across all ranks."""
    micro_batch_size: PositiveInt = 32
    """Rows per forward/backward on one rank (with packing, packed rows of several examples)."""
    packing: bool = False
    """Pack each step's examples into rows of up to max_tokens tokens (first-fit, longest first), each
    example with its own positions from 0 and attending only to itself (transformers' packed-sequence
    masks: the loss equals the unpacked one), instead of padding every example to the longest."""
    optimizer: OptimizerConfig = OptimizerConfig(lr=1e-3)
    """AdamW's settings for the SFT steps (a fresh optimizer: RL after a warm-up starts its own)."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """The learning rate schedule over the SFT steps."""
    grad_clip: PositiveFloat | None = 1.0
    """Clip the global gradient norm to this value; None: no clip."""
    max_tokens: PositiveInt = 1024
    """The longest example (prompt + response, or the whole conversation), in tokens; the packed row length."""
    overlong: Literal["error", "drop"] = "error"
    """Examples over max_tokens: error stops at load time naming the first; drop leaves them out (counted)."""

    @model_validator(mode="after")
    def _one_length(self) -> SFTConfig:
        one_length(self, "SFT")
        return self

    def total_steps(self, examples: int) -> int:
        """The run's optimizer steps over ``examples`` examples: ``steps``, or ``epochs`` passes rounded up."""
        return total_steps(self, examples)

    def describe_length(self, examples: int, unit: str = "examples") -> str:
        """'300 optimizer steps (2 epochs of 4,800 examples, 32 per step)', or '100 optimizer steps'."""
        return describe_length(self, examples, unit)


def one_length(section, what: str) -> None:
    """A standalone run's section (``steps``, ``epochs``, ``batch_size``) sets its length one way: steps or
    epochs, not both; neither is 100 steps. ``what`` names the run ("SFT") in the message."""
    if section.steps is not None and section.epochs is not None:
        raise ValueError(f"steps={section.steps} and epochs={section.epochs:g} both set the length of the {what} "
                         "run; remove one of them. On the command line, switch a file's epochs to steps by setting "
                         "epochs to null beside them (e.g. sft.steps=50 sft.epochs=null), or the other way round")
    if section.epochs is None and section.steps is None:
        section.steps = 100


def total_steps(section, items: int) -> int:
    """``section.steps``, or ``section.epochs`` passes over ``items`` in batches of ``section.batch_size``,
    rounded up."""
    if section.epochs is None:
        return section.steps
    return max(1, math.ceil(section.epochs * items / section.batch_size))


def describe_length(section, items: int, unit: str) -> str:
    """'300 optimizer steps (2 epoch(s) of 4,800 examples, 32 per step)', or '100 optimizer steps'."""
    steps = f"{total_steps(section, items)} optimizer steps"
    if section.epochs is None:
        return steps
    return f"{steps} ({section.epochs:g} epoch(s) of {items:,} {unit}, {section.batch_size} per step)"
