"""The advantage estimators by name (``algorithm.advantage.estimator``): knobs, functions and rows.

Torch-free, so the config takes its names, capabilities and knobs from here without importing torch. An
estimator is up to two stages, each a function with one signature per stage: the response-level baseline
(``Baseline``: rewards [N, G] -> [N, G]) and either the token level (``TokenEstimator``, after the KL
penalty: returns or GAE) or the turn level (``TurnEstimator``: one advantage per model turn of multi-turn
trajectories). The functions import their tensor maths when they first run: ``gyre.algos.advantages``,
``gyre.algos.baselines`` and ``gyre.algos.agentic`` hold it and name each estimator's paper. Every function
gets the ``AdvantageSpec``: the section's shared knobs, and in ``spec.knobs`` the estimator's own (a frozen
dataclass declared with ``knob``, from which the config's ``algorithm.advantage.<name>`` section is
generated). A new estimator is its maths, then here its knobs (if any), its functions and a row in
``ESTIMATORS``; no config file changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gyre.algos.tables import Registry, knob, resolve_knobs, variant_knobs

if TYPE_CHECKING:
    import torch

    from gyre.algos.agentic import TurnBatch
    from gyre.algos.baselines import BaselineContext
    from gyre.algos.stats import RunningMoments

NormScope = Literal["none", "group", "batch", "running"]


class Baseline(Protocol):
    """Response-level rewards [N, G] -> baselined (and scaled) rewards [N, G]; every estimator gets the spec
    (scopes, eps, ddof, its knobs), the running moments and the ``BaselineContext`` (lengths, greedy
    rewards), and uses what it needs."""

    def __call__(self, rewards: torch.Tensor, s: AdvantageSpec, running: RunningMoments | None = None,
                 context: BaselineContext | None = None) -> torch.Tensor: ...


class TokenEstimator(Protocol):
    """Token rewards [B, T] (critic values, mask) -> (advantages [B, T], returns [B, T] or None); returns are
    the critic's regression targets, None for a critic-free estimator."""

    def __call__(self, token_rewards: torch.Tensor, values: torch.Tensor | None, mask: torch.Tensor,
                 s: AdvantageSpec) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class TurnEstimator(Protocol):
    """The turns of E multi-turn trajectories (``TurnBatch``: per-turn rewards, states, the trajectories'
    response-level rewards) and the spec -> one advantage per turn [E, K], spread over each turn's tokens."""

    def __call__(self, turns: TurnBatch, s: AdvantageSpec) -> torch.Tensor: ...


# ---- response level ---------------------------------------------------------------------------------------


def _scoped(rewards: torch.Tensor, s: AdvantageSpec, running: RunningMoments | None = None,
            context: BaselineContext | None = None) -> torch.Tensor:
    """The norm_mean / norm_std normalisation (GRPO, Dr.GRPO, Lite PPO are its scope pairs)."""
    from gyre.algos.advantages import normalize_rewards

    return normalize_rewards(rewards, s.norm_mean, s.norm_std, s.std_eps, s.std_ddof, running)


def _rloo(rewards: torch.Tensor, s: AdvantageSpec, running: RunningMoments | None = None,
          context: BaselineContext | None = None) -> torch.Tensor:
    from gyre.algos.advantages import rloo_advantages

    return rloo_advantages(rewards)


def _group_centred_batch_std(rewards: torch.Tensor, s: AdvantageSpec, running: RunningMoments | None = None,
                             context: BaselineContext | None = None) -> torch.Tensor:
    from gyre.algos.advantages import group_centred_batch_std_advantages

    return group_centred_batch_std_advantages(rewards, s.std_eps, s.std_ddof)


def _needs(context: BaselineContext | None, estimator: str, field: str) -> BaselineContext:
    """The context, checked to hold ``field``: the advantage stage fills it from the groups."""
    if context is None or getattr(context, field) is None:
        raise ValueError(f"estimator {estimator} needs a BaselineContext with {field}")
    return context


def _remax(rewards: torch.Tensor, s: AdvantageSpec, running: RunningMoments | None = None,
           context: BaselineContext | None = None) -> torch.Tensor:
    from gyre.algos.baselines import remax_advantages

    return remax_advantages(rewards, _needs(context, "remax", "greedy").greedy)


def _opo(rewards: torch.Tensor, s: AdvantageSpec, running: RunningMoments | None = None,
         context: BaselineContext | None = None) -> torch.Tensor:
    from gyre.algos.baselines import opo_advantages

    return opo_advantages(rewards, _needs(context, "opo", "lengths").lengths)


@dataclass(frozen=True)
class PassAtKKnobs:
    """The pass@k advantage (Chen et al., arXiv 2508.10751; ``gyre.algos.baselines``): how much a response
    raises its group's best-of-k reward, over that reward's std (norm scopes none)."""

    k: int = knob(4, gt=0)
    """The subset size whose best reward the advantage raises (at most rollout.samples_per_prompt; k = 1 is
    GRPO with the population std)."""


def _pass_at_k(rewards: torch.Tensor, s: AdvantageSpec, running: RunningMoments | None = None,
               context: BaselineContext | None = None) -> torch.Tensor:
    from gyre.algos.baselines import pass_at_k_advantages

    k: PassAtKKnobs = s.knobs
    return pass_at_k_advantages(rewards, k.k, s.std_eps)


def _gpg(rewards: torch.Tensor, s: AdvantageSpec, running: RunningMoments | None = None,
         context: BaselineContext | None = None) -> torch.Tensor:
    from gyre.algos.advantages import gpg_advantages

    return gpg_advantages(rewards, s.norm_mean, s.norm_std, s.std_eps, s.std_ddof, running)


# ---- token level ------------------------------------------------------------------------------------------


def _returns(token_rewards: torch.Tensor, values: torch.Tensor | None, mask: torch.Tensor,
             s: AdvantageSpec) -> tuple[torch.Tensor, None]:
    from gyre.algos.advantages import discounted_returns

    return discounted_returns(token_rewards, mask, s.gamma), None


@dataclass(frozen=True)
class GaeKnobs:
    """GAE (Schulman et al., arXiv 1506.02438): PPO's advantages from the critic's values (the estimator
    creates the critic role); the discount is the section's gamma."""

    lam: float = knob(0.95, ge=0, le=1)
    """GAE lambda."""


def _gae(token_rewards: torch.Tensor, values: torch.Tensor | None, mask: torch.Tensor,
         s: AdvantageSpec) -> tuple[torch.Tensor, torch.Tensor]:
    from gyre.algos.advantages import gae_advantages

    k: GaeKnobs = s.knobs
    return gae_advantages(token_rewards, values, mask, s.gamma, k.lam)


# ---- turn level (multi-turn trajectories) -----------------------------------------------------------------


def _step_returns(turns: TurnBatch, s: AdvantageSpec) -> torch.Tensor:
    from gyre.algos.agentic import turn_returns

    return turn_returns(turns.rewards, turns.mask, s.gamma)


def _rebn(turns: TurnBatch, s: AdvantageSpec) -> torch.Tensor:
    from gyre.algos.agentic import rebn_advantages

    return rebn_advantages(turns.rewards, turns.mask, s.gamma, s.std_eps, s.std_ddof)


@dataclass(frozen=True)
class GigpoKnobs:
    """GiGPO (Feng et al., arXiv 2505.10978): the episode return normalised by the section's scopes (group /
    group is GiGPO, group / none its std-free variant) plus a step level over the turns that acted on the
    same state (anchor groups)."""

    step_gamma: float = knob(0.95, ge=0, le=1)
    """Discount per turn of the step level's returns (ROLL ``step_reward_gamma``)."""
    episode_weight: float = knob(1.0, ge=0)
    """Weight w_E of the episode-level advantage (ROLL ``episode_reward_weight``)."""
    step_weight: float = knob(1.0, ge=0)
    """Weight w_S of the step-level advantage (ROLL ``step_reward_weight``; the paper's omega). The step level
    divides by its anchor group's std (std_eps, std_ddof) unless norm_std is none."""


def _gigpo(turns: TurnBatch, s: AdvantageSpec) -> torch.Tensor:
    from gyre.algos.agentic import gigpo_advantages

    k: GigpoKnobs = s.knobs
    # The response-level baseline (group scopes) already made the outcomes GiGPO's episode level A^E.
    return gigpo_advantages(turns.outcomes, turns.rewards, turns.mask, turns.groups, turns.states, k.step_gamma,
                            k.episode_weight, k.step_weight, s.norm_std != "none", s.std_eps, s.std_ddof)


def _chunk_returns(turns: TurnBatch, s: AdvantageSpec) -> torch.Tensor:
    from gyre.algos.agentic import chunk_returns

    return chunk_returns(turns.outcomes, turns.mask, s.gamma)


# ---- the table --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageEstimator:
    """One row of ``ESTIMATORS``: the two stages of the advantage, the knobs and what the config must know."""

    baseline: Baseline
    """Response level, before the reward is placed on the last token (or handed to ``turns``)."""
    advantages: TokenEstimator | None
    """Token level, after the KL penalty; None for a turn-level estimator."""
    scoped: bool
    """True: the baseline is the ``norm_mean`` / ``norm_std`` normalisation. False: the estimator has its own
    baseline and scale, and the config requires both scopes to be none."""
    groups: bool
    """Compares the samples of one prompt with each other (needs several samples per prompt)."""
    critic: bool
    """Needs the critic's values (the config creates the critic role)."""
    turns: TurnEstimator | None = None
    """Turn level, instead of ``advantages``: credit per model turn of multi-turn trajectories (every
    trajectory of the batch must have turns; no token-level KL penalty)."""
    greedy: bool = False
    """The baseline is each prompt's greedy response (ReMax): the rollout generates one per prompt at
    temperature 0 beside the group and scores it; it sets the baseline and never trains."""
    knobs: type | None = None
    """The dataclass of its own knobs (the config's ``algorithm.advantage.<name>`` section); None: none."""

    def __post_init__(self) -> None:
        if (self.advantages is None) == (self.turns is None):
            raise ValueError("an advantage estimator has a token-level stage or a turn-level stage, exactly one")


ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", {
    "reinforce": AdvantageEstimator(_scoped, _returns, scoped=True, groups=False, critic=False),
    "rloo": AdvantageEstimator(_rloo, _returns, scoped=False, groups=True, critic=False),
    "group_centred_batch_std": AdvantageEstimator(_group_centred_batch_std, _returns, scoped=False, groups=True,
                                                  critic=False),
    "gae": AdvantageEstimator(_scoped, _gae, scoped=True, groups=False, critic=True, knobs=GaeKnobs),
    # Multi-turn: normalize_rewards with both scopes none (unscoped rows) leaves the scores as they are.
    "step_returns": AdvantageEstimator(_scoped, None, scoped=False, groups=False, critic=False,
                                       turns=_step_returns),
    "rebn": AdvantageEstimator(_scoped, None, scoped=False, groups=False, critic=False, turns=_rebn),
    "gigpo": AdvantageEstimator(_scoped, None, scoped=True, groups=True, critic=False, turns=_gigpo,
                                knobs=GigpoKnobs),
    "chunk_returns": AdvantageEstimator(_scoped, None, scoped=True, groups=False, critic=False,
                                        turns=_chunk_returns),
    # Baselines of gyre.algos.baselines: the greedy response, the lengths, pass@k, GPG's scale.
    "remax": AdvantageEstimator(_remax, _returns, scoped=False, groups=False, critic=False, greedy=True),
    "opo": AdvantageEstimator(_opo, _returns, scoped=False, groups=True, critic=False),
    "pass_at_k": AdvantageEstimator(_pass_at_k, _returns, scoped=False, groups=True, critic=False,
                                    knobs=PassAtKKnobs),
    "gpg": AdvantageEstimator(_gpg, _returns, scoped=True, groups=True, critic=False),
})
"""The advantage estimators by config name (``algorithm.advantage.estimator``); the config accepts the names
of this table and gives each row's knobs a section of their own."""


@dataclass(frozen=True)
class AdvantageSpec:
    """The advantage stage's knobs (``algorithm.advantage``): the estimator with its own knobs, the
    normalisation of the rewards, the discount, whitening and clips. The config section is generated from
    these fields and ``ESTIMATORS`` (``gyre.config.base.section_from_spec``); the driver's advantage stage
    reads the spec and hands it to the estimator's functions."""

    estimator: str = knob("reinforce", choices=ESTIMATORS)
    """A name of ``gyre.algos.estimator_table.ESTIMATORS``. reinforce: (normalised) outcome reward as returns;
    rloo: leave-one-out baseline; group_centred_batch_std: group-centred over the batch std of the centred
    rewards, per response (REINFORCE++-baseline's response-level form); gae: PPO with a
    critic (creates the critic role). These treat a multi-turn trajectory as one action (its reward is the
    episode return). Credit per model turn, for runs that learn from an environment (``gyre.algos.agentic``):
    step_returns: the discounted return of the turn rewards from each turn on (gamma per turn), no
    baseline (norm scopes none); rebn: those returns normalised over every turn of the batch (GEM; scopes
    none); gigpo: the episode return normalised by the scopes (group/group is GiGPO, group/none its
    std-free variant) plus a step level over turns that saw the same state (the gigpo section); chunk_returns
    (IPA): the normalised episode return discounted back from the last turn, gamma^(turns after) * R.
    Baselines that read more than the rewards (``gyre.algos.baselines``): remax: each prompt's greedy
    response's reward (the rollout adds one greedy sample per prompt, scored, never trained; scopes none);
    opo: the length-weighted group mean (scopes none); pass_at_k: how much a response raises its group's
    best-of-k reward, over that reward's std (the pass_at_k section; scopes none); gpg: the scoped
    normalisation (group mean, std group or none) times B / (B - M), M the samples of groups with equal
    rewards. An estimator's own knobs are the section of its name (algorithm.advantage.gae.lam)."""
    norm_mean: NormScope = "group"
    """Scope of the mean subtracted from rewards: group (per prompt), batch, running (per tag) or none."""
    norm_std: NormScope = "group"
    """Scope of the std rewards are divided by; none leaves the scale."""
    std_eps: float = knob(1e-6, gt=0)
    """Added to every std of this section, (x - mean) / (std + std_eps): the norm scopes, whitening, turn credit."""
    std_ddof: Literal[0, 1] = 1
    """Degrees of freedom of those stds: 1 the sample std (torch's default), 0 the population std."""
    gamma: float = knob(1.0, ge=0, le=1)
    """Discount per token of the returns and GAE; per model turn for step_returns, rebn and chunk_returns
    (GEM uses 0.9 in its games)."""
    reward_clip: float | None = knob(None, gt=0)
    """Clamp the (normalised) rewards to +-value."""
    whiten: bool = False
    """Whiten advantages over the tokens that train, (A - mean) / (std + std_eps) with std_ddof, mean and
    std over tokens (longer responses weigh more); with a critic-free estimator these are the returns after
    the KL penalty, which is REINFORCE++'s normalisation. Fewer than 2 tokens: left as they are; all equal: 0."""
    clip: float | None = knob(None, gt=0)
    """Clamp the final advantages to +-value; None: no clamp."""
    knobs: Any = variant_knobs(ESTIMATORS, "estimator")
    """The estimator's own knobs (its row's dataclass), from the section of its name."""

    def __post_init__(self) -> None:
        resolve_knobs(self)
