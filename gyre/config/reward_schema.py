"""The ``reward`` section: one reward domain, or several routed by each prompt's ``tag``.

A single-domain config keeps the short form (``reward: {type: math}``); it is read as
``reward: {domains: {default: {type: math}}}``, the form the resolved config prints. Several domains
each name the tags they score and, optionally, their share of every training batch (``ratio``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from gyre.config.base import DeviceList, NonNegInt, PositiveFloat, PositiveInt, StrictModel, UnitFloat

RewardType = Literal["math", "code", "ifeval", "choice", "function", "judge", "reward_model"]

DEFAULT_JUDGE_TEMPLATE = (
    "You are grading an answer to a question.\nQuestion: {prompt}\nReference answer: {ground_truth}\n"
    "Answer to grade: {response}\nReply with 'Score: N' where N is an integer from 0 (wrong) to 10 (perfect).\n")


class ShapingTerm(StrictModel):
    """A term added to a domain's reward: ``weight * function(response, ground_truth, **kwargs)``."""

    function: str
    """"module:function", e.g. gyre.rewards.shaping:format_reward or gyre.rewards.shaping:length_penalty."""
    kwargs: dict[str, object] = {}
    """Extra keyword arguments of the shaping function."""
    weight: float = 1.0
    """The term's factor (negative for a penalty)."""


class AdaptiveTimeoutConfig(StrictModel):
    """RollPacker's adaptive sandbox timeout: min(max(t_min, lam * slowest correct run), t_max) per problem."""

    t_min: PositiveFloat = 2.0
    """The shortest limit in seconds, however fast the correct runs were."""
    t_max: PositiveFloat = 30.0
    """The longest limit in seconds, however slow the correct runs were."""
    lam: Annotated[float, Field(ge=1)] = 1.5
    """The margin over the slowest correct run of the problem (RollPacker's lambda)."""

    @model_validator(mode="after")
    def _ordered(self) -> AdaptiveTimeoutConfig:
        if self.t_min > self.t_max:
            raise ValueError(f"adaptive_timeout.t_min={self.t_min} exceeds t_max={self.t_max}")
        return self


class SandboxConfig(StrictModel):
    """How a code domain runs the policy's programs (``gyre.rewards.sandbox``)."""

    url: str | None = None
    """A remote sandbox (``gyre sandbox-serve``) at this base URL, e.g. http://sandbox-host:8765, so that
    untrusted code leaves the training nodes; None runs programs on the reward workers' machine."""
    token_env: str | None = None
    """Environment variable holding the remote sandbox's access token (sent as a bearer token)."""
    allow_weak: bool = False
    """Accept running untrusted code where the kernel gives no namespaces (only rlimits, a process group
    and the Python audit hook: the program can read what the reward worker's user can read). Off:
    gyre refuses to start such a domain and says why."""
    disk_mb: PositiveInt = 64
    """Size of each program's work directory (a tmpfs: all its files together)."""


class JudgeConfig(StrictModel):
    """An LLM judge: a local HF model served by gyre's rollout engine as a role, or an OpenAI-compatible
    endpoint."""

    backend: Literal["local", "openai"] = "local"
    """local: a judge model run by gyre as a role; openai: an OpenAI-compatible chat endpoint."""
    model_path: str | None = None
    """local: a Hugging Face causal-LM directory, or a Hub id in the local Hugging Face cache (its main
    revision; see model.path)."""
    engine: Literal["hf", "vllm"] = "hf"
    """local: the engine that runs the judge, as rollout.backend: hf (built in) or vllm (vLLM 0.32 in the
    judge actor's process; install: docs/guides/engines.md)."""
    devices: DeviceList = (0,)
    """local: devices of the judge role (it stays resident; it is not time-shared)."""
    max_batch_size: PositiveInt | None = None
    """local: most requests the judge's engine decodes at once; None: all of a call's requests."""
    url: str | None = None
    """openai: the API base URL, e.g. http://localhost:8000/v1 (a vLLM or SGLang server, or a provider)."""
    model: str | None = None
    """openai: the model name sent with each request."""
    api_key_env: str | None = None
    """openai: environment variable holding the API key (never the key itself in a config)."""
    retries: NonNegInt = 3
    """openai: re-sends of a request on network errors, 429 and 5xx (exponential back-off)."""
    rate_limit_per_s: PositiveFloat | None = None
    """openai: most requests per second from each reward process."""
    request_timeout_s: PositiveFloat = 30.0
    """openai: the deadline of one request in seconds."""
    template: str = DEFAULT_JUDGE_TEMPLATE
    """Prompt for the judge, with {prompt}, {response} and {ground_truth} filled in."""
    score_pattern: str = r"(?i)score\s*[:=]\s*(-?\d+(?:\.\d+)?)"
    """Regex whose first group is the score in the judge's reply (the last match counts)."""
    max_score: PositiveFloat = 10.0
    """The judge's scale: the reward is score / max_score, clamped to [0, 1]."""
    pass_score: Annotated[float, Field(ge=0)] = 0.5
    """Rewards at or above this count as correct for accuracy metrics."""
    max_new_tokens: PositiveInt = 32
    """The longest judge reply in tokens (greedy decoding); enough for the score line."""

    @model_validator(mode="after")
    def _backend_needs(self) -> JudgeConfig:
        if self.backend == "local" and not self.model_path:
            raise ValueError("a local judge needs judge.model_path (a Hugging Face model directory)")
        if self.backend == "openai" and not (self.url and self.model):
            raise ValueError("an openai judge needs judge.url (e.g. http://host:8000/v1) and judge.model")
        return self


class RewardModelConfig(StrictModel):
    """A scalar reward model: a local sequence-classification model scoring prompt + response."""

    path: str
    """A sequence-classification model directory, or a Hub id in the local Hugging Face cache (its main
    revision; see model.path)."""
    devices: DeviceList = (0,)
    """Devices of the reward model's workers (one each); it stays resident."""
    micro_batch_size: PositiveInt = 16
    """Sequences per forward pass of one worker."""
    pass_score: float = 0.0
    """Scores above this count as correct for accuracy metrics."""


class DomainConfig(StrictModel):
    """How the samples of one domain are scored."""

    type: RewardType = "math"
    """math (math-verify), code (tests in a sandbox), ifeval, choice (multiple choice), function (your
    own), judge (an LLM judge) or reward_model (a scalar reward model)."""
    function: str | None = None
    """For type "function": "package.module:function" or "path/to/file.py:function"."""
    kwargs: dict[str, object] = {}
    """Extra keyword arguments of the reward function (e.g. answer_pattern for math, partial_credit)."""
    tags: list[str] | None = None
    """Prompt tags this domain scores; default: the domain's name. The single-domain form scores every tag."""
    ratio: Annotated[float, Field(gt=0)] | None = None
    """Share of each training batch's prompts drawn from this domain (set it on every domain or none)."""
    timeout_s: PositiveFloat | None = None
    """Wall-clock limit per sample; past it the sample scores 0 with status timeout. None: 10 s. A
    function with its own ``deadline_s`` sets each sample's limit instead: the code reward derives it from
    the sample's tests (tests x per-test timeout + margins; set the per-test timeout with
    kwargs.timeout_s or adaptive_timeout), so code domains refuse this key."""
    processes: PositiveInt = 1
    """Child processes per reward worker (isolation from hangs and crashes)."""
    workers: PositiveInt = 1
    """Reward worker actors of this domain, each on one CPU."""
    retries: NonNegInt = 2
    """Re-sends of a reward call whose worker actor died or hung (not of a reward that raised: that is
    deterministic); past them the run stops with an error naming the domain, worker and cause."""
    max_error_frac: UnitFloat = 0.5
    """The run stops, with the first error, when more than this share of the domain's rewards in one step
    fail (raise, return a non-number or NaN, time out); 1 never stops."""
    shaping: list[ShapingTerm] = []
    """Terms added to the domain's reward (format, length, ...)."""
    adaptive_timeout: AdaptiveTimeoutConfig | None = None
    """type code: per-problem timeouts from the slowest correct run (RollPacker); None keeps kwargs.timeout_s."""
    sandbox: SandboxConfig | None = None
    """type code: where and how programs run (default: the local sandbox, refusing weak containment)."""
    judge: JudgeConfig | None = None
    """For type judge: the judge's settings."""
    reward_model: RewardModelConfig | None = None
    """For type reward_model: the model's settings."""

    @model_validator(mode="after")
    def _type_needs(self) -> DomainConfig:
        if self.type == "function" and not self.function:
            raise ValueError('reward type "function" needs function: "module:function"')
        if self.function and ":" not in self.function:
            raise ValueError(f'reward function {self.function!r} must look like "module:function"')
        if self.type == "judge" and self.judge is None:
            raise ValueError('reward type "judge" needs a judge section (backend local or openai)')
        if self.type == "reward_model" and self.reward_model is None:
            raise ValueError('reward type "reward_model" needs a reward_model section (path, devices)')
        if self.adaptive_timeout is not None and self.type != "code":
            raise ValueError("adaptive_timeout applies to the code reward only")
        if self.sandbox is not None and self.type != "code":
            raise ValueError("sandbox applies to the code reward only")
        if self.type == "code" and self.timeout_s is not None:
            raise ValueError("a code domain derives each sample's time limit from its tests (tests x per-test "
                             "timeout + margins); remove timeout_s and set the per-test timeout with "
                             "kwargs.timeout_s (default 10) or adaptive_timeout")
        return self

    @property
    def sample_timeout_s(self) -> float:
        """The per-sample limit of reward workers where the reward function does not derive its own."""
        return 10.0 if self.timeout_s is None else self.timeout_s

    @property
    def model_role(self) -> Literal["judge", "reward_model"] | None:
        """The kind of model role that scores this domain (a local judge or a reward model); None when
        reward workers run a function (an endpoint judge included)."""
        if self.type == "reward_model":
            return "reward_model"
        if self.type == "judge" and self.judge.backend == "local":
            return "judge"
        return None

    @property
    def scoring_model(self) -> JudgeConfig | RewardModelConfig | None:
        """The config of that model role (it names the role's devices)."""
        return {"judge": self.judge, "reward_model": self.reward_model}.get(self.model_role)


class RewardConfig(StrictModel):
    domains: dict[str, DomainConfig] = {"default": DomainConfig()}
    """Reward domains by name. The short form ``reward: {type: ..., ...}`` is the single domain "default"."""

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: object) -> object:
        if not isinstance(data, dict) or "domains" not in data:
            return {"domains": {"default": data if isinstance(data, dict) else {}}}
        extra = sorted(set(data) - {"domains"})
        if extra:
            raise ValueError(f"with reward.domains, put {', '.join(extra)} inside a domain "
                             f"(reward.domains.<name>.{extra[0]})")
        return data

    @model_validator(mode="after")
    def _routing(self) -> RewardConfig:
        if not self.domains:
            raise ValueError("reward.domains is empty: name at least one domain")
        owner: dict[str, str] = {}
        for name in self.domains:
            for tag in self.tags_of(name):
                if tag in owner:
                    raise ValueError(f"tag {tag!r} is claimed by reward domains {owner[tag]!r} and {name!r}")
                owner[tag] = name
        with_ratio = [n for n, d in self.domains.items() if d.ratio is not None]
        if with_ratio and len(with_ratio) != len(self.domains):
            missing = sorted(set(self.domains) - set(with_ratio))
            raise ValueError(f"ratio is set on {with_ratio} but not on {missing}: set it on every domain or none")
        if with_ratio and abs(sum(d.ratio for d in self.domains.values()) - 1.0) > 1e-6:
            raise ValueError(f"reward domain ratios sum to {sum(d.ratio for d in self.domains.values()):g}, not 1")
        return self

    def tags_of(self, name: str) -> list[str]:
        """Tags a domain scores; the single default domain of the short form scores every tag (empty list)."""
        domain = self.domains[name]
        if domain.tags is not None:
            return domain.tags
        return [] if list(self.domains) == ["default"] else [name]

    @property
    def single(self) -> bool:
        return list(self.domains) == ["default"] and self.domains["default"].tags is None
