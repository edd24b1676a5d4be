"""Typed records that flow between the stages of a run, one per stage.

prompt file row -> PromptRecord -> Group (admitted) -> GenerationRequest -> GenerationResult -> Trajectory
(segments, + RewardResult) -> Group (committed) -> TrainBatch (tensors) -> trainer. Shapes: B rows (one per
trajectory, or per model turn with step-level samples), L padded sequence length (prompt + response).

Weight versions: a ``WeightVersion`` is the number of RL training steps whose updates the weights
contain (0 = the initial model). Every generated sample records the version that produced it.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

if TYPE_CHECKING:  # torch is imported where tensors are touched: reward processes never need it
    import torch

WeightVersion = int
FinishReason = Literal["eos", "stop", "length", "abort"]
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
    ignore_eos: bool = False
    """Keep sampling past end-of-sequence tokens (benchmarks that need set lengths)."""


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
    columns: dict = dataclasses.field(default_factory=dict)
    """The row's other columns, plain JSON-able values: reward functions get them as keyword arguments
    (see ``gyre.rewards.base.call_reward``)."""
    messages: list | None = None
    """The prompt as the chat the data gave ({"role", "content"} messages), None for a text prompt: TRL
    reward functions get it, and the completion as messages, as TRL passes conversational data."""


@dataclass
class GenerationRequest:
    """Ask an engine for ``n`` samples of one prompt (samples ``first_sample`` .. ``first_sample + n - 1``)."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    seed: int = 0
    """Seeds the sampler; the same request, seed and weights give the same samples."""
    first_sample: int = 0
    """Index of the first sample: a prompt's samples sent as separate requests keep their own streams."""
    prefix: tuple[int, ...] = ()
    """Response tokens already sampled (continuing an interrupted sample; needs n == 1): the engine
    re-prefills them and samples on from position len(prefix) within ``params.max_new_tokens``."""

    def __post_init__(self) -> None:
        if self.prefix and self.n != 1:
            raise ValueError(f"request {self.request_id}: a continuation (prefix) is one sample, got n={self.n}")


@dataclass
class GenerationResult:
    """One sampled response, or the part of it a request added (token-in, token-out: ``response_ids``
    are exactly what was sampled). A continuation's result holds only the tokens after its prefix."""

    request_id: str
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_text: str
    """Decoded response without special tokens (prefix included for a continuation)."""
    logprobs: list[float]
    """Sampler log-prob of each response token, len == len(response_ids)."""
    finish_reason: FinishReason
    """"abort": the request was aborted; the tokens so far are returned so it can be continued."""
    versions: list[WeightVersion]
    """The weight version that sampled each token (a request continued across a weight update spans several)."""
    offset: int = 0
    """Response tokens before these (the request's prefix)."""

    @property
    def weight_version(self) -> WeightVersion:
        """The oldest version among its tokens (the first: versions never decrease along a response)."""
        return self.versions[0] if self.versions else -1


@dataclass
class RewardResult:
    score: float
    correct: bool | None = None
    """Whether the answer was right, for accuracy metrics (None: the reward cannot tell, and the sample is
    left out of them; a score is never read as correctness)."""
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
class Segment:
    """A contiguous run of a trajectory's tokens after the prompt, all from one source.

    Model tokens (``trainable``) carry the sampler's log-probs and the weight version that sampled them;
    tokens the model did not choose (an environment's observation, a tool's output) are kept for context
    and never trained on.
    """

    token_ids: list[int]
    logprobs: list[float]
    """Sampler log-prob of each token, len == len(token_ids) (0.0 for tokens the model did not sample)."""
    weight_version: WeightVersion | None
    """The policy version that sampled these tokens; None for tokens the model did not sample."""
    trainable: bool = True
    """Whether these tokens enter the policy loss (model tokens) or only give context."""


TrajectoryStatus = Literal["generating", "generated", "scored", "aborted"]


@dataclass
class TurnRecord:
    """One model turn of a multi-turn trajectory: where its tokens are and what the environment paid."""

    start: int
    """Offset of its first token among the trajectory's response tokens (observations included)."""
    end: int
    """Offset just past its last token."""
    reward: float = 0.0
    """The environment's reward for this turn's action."""
    state: str = ""
    """A key of the observation the turn acted on: turns of a group with equal keys share a state (GiGPO)."""


def window_start(turns: Sequence[TurnRecord], k: int, window: int) -> int:
    """Where the context of turn ``k`` starts among the response tokens when a turn is shown the ``window``
    turns before it, each with the observation that followed it (window 0: only the last observation).
    The first observation (the prompt) is always shown."""
    if k == 0:
        return 0
    if window == 0:
        return turns[k - 1].end
    return turns[max(0, k - window)].start


@dataclass
class Trajectory:
    """One sampled response to a prompt (single-turn: one segment; multi-turn: many), its reward, its state."""

    prompt: PromptRecord
    sample_index: int
    """Which of the group's samples this is (its sampling stream within the group's seed)."""
    segments: list[Segment] = dataclasses.field(default_factory=list)
    response_text: str = ""
    """The decoded response, without special tokens (what the reward reads)."""
    finish_reason: FinishReason | None = None
    reward: RewardResult | None = None
    status: TrajectoryStatus = "generating"
    turns: list[TurnRecord] = dataclasses.field(default_factory=list)
    """Multi-turn trajectories: each model turn (empty for single-turn ones)."""
    window: int | None = None
    """Step-level samples: each model turn trains as a row of its own, shown the prompt and the ``window``
    turns before it with their observations, as it was when sampled. None: the whole trajectory is one row."""

    @classmethod
    def from_result(cls, prompt: PromptRecord, result: GenerationResult) -> Trajectory:
        """A single-turn trajectory from the engine's result: one trainable segment per weight version."""
        t = cls(prompt, result.sample_index, status="generated")
        t.extend(result)
        return t

    def extend(self, result: GenerationResult) -> None:
        """Append what a (continued) request sampled: a segment per run of equal weight versions."""
        if result.offset != len(self.response_ids):
            raise ValueError(f"trajectory {self.prompt.uid}#{self.sample_index} has {len(self.response_ids)} "
                             f"tokens, the result continues from {result.offset}")
        # Versions never decrease along a response (weights only move forward), so each run of equal
        # versions ends where bisection says: a few steps per weight update, not a pass over every token.
        versions, start = result.versions, 0
        while start < len(versions):
            same = versions[start] == versions[-1]  # the common case: one version to the end
            end = len(versions) if same else bisect.bisect_right(versions, versions[start], start)
            self.segments.append(Segment(result.response_ids[start:end], result.logprobs[start:end], versions[start]))
            start = end
        self.response_text, self.finish_reason = result.response_text, result.finish_reason

    @property
    def response_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    def rows(self) -> list[tuple[int, int, int]]:
        """Its training rows as offsets among the response tokens: (context from, trained from, end). One
        row (0, 0, all) for the whole trajectory; with step-level samples one row per model turn."""
        if self.window is None or not self.turns:
            return [(0, 0, len(self.response_ids))]
        return [(window_start(self.turns, k, self.window), turn.start, turn.end) for k, turn in enumerate(self.turns)]

    @property
    def logprobs(self) -> list[float]:
        return [lp for s in self.segments for lp in s.logprobs]

    @property
    def weight_version(self) -> WeightVersion:
        """The oldest version that sampled any of its tokens (its staleness is measured from this)."""
        versions = [s.weight_version for s in self.segments if s.weight_version is not None]
        if not versions:
            raise ValueError(f"trajectory {self.prompt.uid}#{self.sample_index} has no sampled tokens")
        return min(versions)


GroupStatus = Literal["admitted", "committed", "aborted"]

GREEDY_SAMPLE = -1
"""Sample index of a group's greedy response (ReMax's baseline): no sampled stream has it."""


@dataclass
class Group:
    """The samples of one prompt: the unit that is admitted, committed and normalised over.

    Advantage baselines (group mean, leave-one-out) are taken over a group's trajectories, found through
    this record, never by the position of rows in a batch.
    """

    group_id: str
    """Unique within a run; also the id of its generation request(s)."""
    prompt: PromptRecord
    size: int
    """Trajectories the group is complete with."""
    seed: int
    """Seeds the sampling of its trajectories (sample i uses stream i): regenerating reproduces them."""
    admitted_version: WeightVersion
    """The policy version current when the group was admitted (its start version)."""
    trajectories: list[Trajectory] = dataclasses.field(default_factory=list)
    status: GroupStatus = "admitted"
    admitted_for: int = 0
    """The training step it was admitted for (under lockstep asynchrony, the batch it trains in)."""
    greedy: Trajectory | None = None
    """The prompt's greedy response (temperature 0, sample index ``GREEDY_SAMPLE``), when the estimator's
    baseline needs it (ReMax): scored like the others, never among ``trajectories``, never trained."""

    @property
    def response_tokens(self) -> int:
        """Tokens the policy generated for its samples so far (trainable segments: not observations)."""
        return sum(len(seg.token_ids) for t in self.trajectories for seg in t.segments if seg.trainable)

    @property
    def complete(self) -> bool:
        """Every wanted trajectory is scored."""
        return sum(t.status == "scored" for t in self.trajectories) >= self.size

    def to_dict(self) -> dict:
        """Plain data (lists, numbers, strings) for a checkpoint: ``from_dict`` gives the group back exactly."""
        out = dataclasses.asdict(self)
        for t in [*out["trajectories"], *([out["greedy"]] if out["greedy"] else [])]:
            del t["prompt"]  # the group's own
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Group:
        prompt = PromptRecord(**data["prompt"])

        def trajectory(t: dict) -> Trajectory:
            reward = RewardResult(**t["reward"]) if t["reward"] is not None else None
            segments = [Segment(**s) for s in t["segments"]]
            turns = [TurnRecord(**turn) for turn in t.get("turns", [])]
            return Trajectory(prompt, t["sample_index"], segments, t["response_text"], t["finish_reason"], reward,
                              t["status"], turns, t.get("window"))
        greedy = data.get("greedy")
        return cls(**{**data, "prompt": prompt, "trajectories": [trajectory(t) for t in data["trajectories"]],
                      "greedy": trajectory(greedy) if greedy else None})


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
    versions: torch.Tensor | None = None
    """[B, L] int64, the weight version that sampled each token (-1 on tokens the model did not sample)."""
    old_logprobs: torch.Tensor | None = None
    """[B, L] float32, log pi_old when recomputed by the trainer."""
    ref_logprobs: torch.Tensor | None = None
    """[B, L] float32, reference-model log-probs when a KL term is used."""
    credit_scales: torch.Tensor | None = None
    """[B, L] float32, attention-based credit's scale gamma of each token's non-negative advantage (1 elsewhere)."""
    teacher_logprobs: torch.Tensor | None = None
    """[B, L] float32, the distillation teacher's log-probs of the sampled tokens (algorithm.distill.coef > 0)."""
    token_weights: torch.Tensor | None = None
    """[B, L] float32, weights of each token's policy loss (train-inference importance weights); None is 1."""
    values: torch.Tensor | None = None
    """[B, L] float32, the critic's value of the state before each token, at the weights that scored the batch."""
    returns: torch.Tensor | None = None
    """[B, L] float32, the critic's regression targets (GAE returns)."""
    scores: torch.Tensor | None = None
    """[B] float32, each sample's (shaped) outcome reward; TOPR splits positive from non-positive by it."""
    critic_values: torch.Tensor | None = None
    """[B, M, L] float32, each of M > 1 critics' values (AsyPPO); ``values`` then holds their aggregate."""
    critic_index: torch.Tensor | None = None
    """[B] int64, the critic that trains on each row (AsyPPO's disjoint data division); None: the one critic."""
    entropy_mask: torch.Tensor | None = None
    """[B, L] float32, AsyPPO's entropy filter I^H: 1 where a token's entropy enters the entropy term; None is 1."""
    position_ids: torch.Tensor | None = None
    """[B, L] int64, packed rows (several SFT examples per row): each example's positions from 0, so that
    attention stays within it; None: positions 0..L-1."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


class MetricSums:
    """Token- (or sample-) weighted metric sums; ``means`` divides once everything is merged, so a
    metric averages over all tokens of a step, not over ranks or micro-batches of unequal size.

    A total or count given as a tensor stays on its device until the sums are read (``settle``: one host
    sync for all of them), so a training step does not stop the device for every metric of every
    micro-batch."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, float] = {}
        self._pending: list[tuple[str, object, object]] = []

    def add(self, name: str, total: float | torch.Tensor, count: float | torch.Tensor = 1.0) -> None:
        if hasattr(total, "detach") or hasattr(count, "detach"):  # detached now: no graph is kept alive
            self._pending.append((name, *(v.detach() if hasattr(v, "detach") else v for v in (total, count))))
            return
        self.sums[name] = self.sums.get(name, 0.0) + float(total)
        self.counts[name] = self.counts.get(name, 0.0) + float(count)

    def settle(self) -> MetricSums:
        """Every pending device value to a float, in one transfer."""
        if not self._pending:
            return self
        import torch

        pending, self._pending = self._pending, []
        device = next(v.device for _, t, c in pending for v in (t, c) if hasattr(v, "device"))
        flat = [torch.as_tensor(v, dtype=torch.float64, device=device).reshape(())
                for _, total, count in pending for v in (total, count)]
        values = torch.stack(flat).tolist()
        for i, (name, _, _) in enumerate(pending):
            self.add(name, values[2 * i], values[2 * i + 1])
        return self

    def merge(self, other: MetricSums) -> MetricSums:
        other.settle()
        for name, total in other.sums.items():
            self.add(name, total, other.counts[name])
        return self

    def means(self) -> dict[str, float]:
        self.settle()
        return {k: self.sums[k] / self.counts[k] for k in self.sums if self.counts[k] > 0}

    def __getstate__(self) -> dict:  # what crosses to the driver holds floats only
        self.settle()
        return self.__dict__


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
        if isinstance(value, torch.Tensor) and value.dim() >= 2:  # per-token fields; [B] fields stay whole
            changes[f.name] = value[..., :used]
    return dataclasses.replace(batch, **changes)


@dataclass
class PreferenceBatch:
    """Whole pairs for the trainer: their sequences on adjacent rows, and their reference log-probs."""

    rows: TrainBatch
    """[2P, L]: pair i's chosen sequence on row 2i, its rejected one on row 2i + 1; ``response_mask`` on
    the completion tokens."""
    ref_chosen: torch.Tensor | None = None
    """[P] reference log-prob of each chosen completion (summed); None for a reference-free loss."""
    ref_rejected: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.rows) // 2

    def select(self, pairs: slice) -> PreferenceBatch:
        """Pairs ``pairs.start`` to ``pairs.stop``, their rows trimmed of all-padding columns."""
        start, stop, _ = pairs.indices(len(self))
        rows = trim_to_length(select_rows(self.rows, slice(2 * start, 2 * stop)))
        refs = [None if t is None else t[start:stop] for t in (self.ref_chosen, self.ref_rejected)]
        return dataclasses.replace(self, rows=rows, ref_chosen=refs[0], ref_rejected=refs[1])

    def split(self, parts: int) -> list[PreferenceBatch]:
        """``parts`` contiguous shares of equal size (the pair count must divide)."""
        if len(self) % parts:
            raise ValueError(f"{len(self)} pairs do not split into {parts} equal shares")
        share = len(self) // parts
        return [self.select(slice(i * share, (i + 1) * share)) for i in range(parts)]

    def micro_batches(self, pairs: int) -> list[PreferenceBatch]:
        """Consecutive slices of at most ``pairs`` pairs."""
        return [self.select(slice(i, i + pairs)) for i in range(0, len(self), pairs)]
