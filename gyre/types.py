"""Typed records that flow between the stages of a run, one per stage.

prompt file row -> PromptRecord -> GenerationRequest -> GenerationResult (+ RewardResult) -> Sample
-> TrainBatch (tensors) -> trainer. Shapes: B samples, L padded sequence length (prompt + response).

Weight versions: a ``WeightVersion`` is the number of RL training steps whose updates the weights
contain (0 = the initial model). Every generated sample records the version that produced it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from gyre.tracking.sums import MetricSums

if TYPE_CHECKING:  # torch is imported where tensors are touched: reward processes never need it
    import torch

WeightVersion = int
FinishReason = Literal["eos", "stop", "length"]
RewardStatus = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request is sampled.

    The log-probs an engine reports are those of the distribution it sampled from: softmax(logits /
    temperature), truncated by top_k / top_p and renormalised. temperature == 0 is greedy decoding
    (log-probs then come from temperature 1).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()


@dataclass
class PromptRecord:
    """One training or validation prompt, tokenised."""

    uid: str
    """Where it came from, "file:line" (JSONL) or "file:row" (Parquet); unique within a run."""
    prompt_text: str
    """The text the model sees (after the chat template, if any)."""
    prompt_ids: list[int]
    ground_truth: str
    tag: str | None = None
    domain: str = "default"
    """The reward domain that scores it (from its tag; see ``gyre.data.domains``)."""
    question: str = ""
    """What was asked, without any chat template (the text a judge or a reward function reads)."""


@dataclass
class GenerationRequest:
    """Ask an engine for ``n`` samples of one prompt."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    seed: int = 0
    """Seeds the sampler; the same request, seed and weights give the same samples."""


@dataclass
class GenerationResult:
    """One sampled response (token-in, token-out: ``response_ids`` are exactly what was sampled)."""

    request_id: str
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_text: str
    """Decoded response without special tokens."""
    logprobs: list[float]
    """Sampler log-prob of each response token, len == len(response_ids)."""
    finish_reason: FinishReason
    weight_version: WeightVersion


@dataclass
class RewardResult:
    score: float
    correct: bool | None = None
    """Whether the answer was right, for accuracy metrics (None: the reward cannot tell)."""
    status: RewardStatus = "ok"
    """"error" (the function raised, returned junk or crashed its process) or "timeout": score is 0."""
    error: str | None = None
    """What went wrong, for the log."""
    latency_s: float = 0.0
    """Seconds the reward took (set by the reward runner)."""
    info: dict = dataclasses.field(default_factory=dict)
    """Reward-specific details, plain JSON-able values (e.g. a code sandbox's run times per test)."""

    @classmethod
    def failed(cls, status: RewardStatus, error: str) -> RewardResult:
        return cls(score=0.0, correct=False, status=status, error=error[:500])


@dataclass
class Sample:
    """A scored response and the prompt it answers."""

    prompt: PromptRecord
    result: GenerationResult
    reward: RewardResult


@dataclass
class TrainBatch:
    """Padded tensors for the trainer; every per-token field is [B, L] and aligned with ``input_ids``.

    Index p of a per-token field refers to token ``input_ids[:, p]`` (its log-prob given the tokens
    before it); position 0 is never a response token. Rows are right-padded prompt + response.
    """

    input_ids: torch.Tensor
    """[B, L] int64."""
    attention_mask: torch.Tensor
    """[B, L] int64, 1 on real tokens."""
    response_mask: torch.Tensor
    """[B, L] float32, 1 on response tokens that count in the loss."""
    advantages: torch.Tensor
    """[B, L] float32, each response token's advantage (an outcome advantage is the same on every token)."""
    rollout_logprobs: torch.Tensor
    """[B, L] float32, the sampler's log-probs (0 off the response)."""
    old_logprobs: torch.Tensor | None = None
    """[B, L] float32, log pi_old when recomputed by the trainer."""
    ref_logprobs: torch.Tensor | None = None
    """[B, L] float32, reference-model log-probs when a KL term is used."""
    token_weights: torch.Tensor | None = None
    """[B, L] float32, weights of each token's policy loss (train-inference importance weights); None is 1."""
    values: torch.Tensor | None = None
    """[B, L] float32, the critic's value of the state before each token, at the weights that scored the batch."""
    returns: torch.Tensor | None = None
    """[B, L] float32, the critic's regression targets (GAE returns)."""
    scores: torch.Tensor | None = None
    """[B] float32, each sample's (shaped) outcome reward; TOPR splits positive from non-positive by it."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class TrainStepResult:
    """What one trainer rank reports for one ``train`` / ``train_sft`` call."""

    metrics: MetricSums
    grad_norms: list[float]
    """Pre-clip gradient norm of each optimizer step (equal on every rank after the all-reduce)."""
    lr: float
    """Learning rate the last optimizer step used."""

    @staticmethod
    def summarize(results: list[TrainStepResult]) -> dict[str, float]:
        """Metrics of one driver step: token-weighted means over every rank, mean grad norm."""
        merged = MetricSums()
        for r in results:
            merged.merge(r.metrics)
        norms = results[0].grad_norms
        return {**merged.means(), "grad_norm": sum(norms) / len(norms), "lr": results[0].lr}


R = TypeVar("R")


def select_rows(record: R, index: torch.Tensor | slice) -> R:
    """A copy of a tensor record (e.g. TrainBatch) keeping rows ``index`` of every tensor field."""
    import torch

    changes = {}
    for f in dataclasses.fields(record):  # type: ignore[arg-type]
        value = getattr(record, f.name)
        if isinstance(value, torch.Tensor):
            changes[f.name] = value[index]
    return dataclasses.replace(record, **changes)  # type: ignore[type-var]


def trim_to_length(batch: TrainBatch) -> TrainBatch:
    """Drop trailing columns that are padding in every row (cheaper forward passes)."""
    import torch

    used = int(batch.attention_mask.sum(dim=1).max().item()) if len(batch) else 0
    changes = {}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, torch.Tensor) and value.dim() == 2:  # per-token fields; [B] fields stay whole
            changes[f.name] = value[:, :used]
    return dataclasses.replace(batch, **changes)
