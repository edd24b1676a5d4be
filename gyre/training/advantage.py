"""The driver's advantage stage: from scored samples and log-probs to per-token advantages and masks.

It runs on the driver, on CPU tensors, in the order the reference notes fix for ROLL (so results match
its recipes): reward shaping -> sample masks -> response-level normalisation -> reward clip -> token
rewards (outcome on the last token, minus an optional KL penalty) -> estimator (returns or GAE) ->
whitening and clip. A turn-level estimator (multi-turn trajectories) replaces the token rewards and the
token-level estimator: it turns each trajectory's per-turn rewards and states, and its response-level
reward, into one advantage per model turn, spread over that turn's tokens (observations get none).
Every formula is a pure function of ``gyre.algos``; this module only wires them to the config and keeps
the state that outlives a step (running moments, the adaptive KL coefficient).

Statistics (group means, batch std) are taken over every sample of the batch, masked ones included:
masks decide which tokens train, not what a prompt's baseline is. Whitening is the exception, by
design: it normalises the advantages (the returns, for a critic-free estimator) over the tokens that
train, after the KL penalty, which is REINFORCE++'s global normalisation (arXiv 2501.03262).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gyre.algos.advantages import outcome_token_rewards
from gyre.algos.agentic import TurnBatch
from gyre.algos.asyppo import aggregate_values, critic_rows, disagreement_masks
from gyre.algos.attention_credit import apply_credit
from gyre.algos.baselines import BaselineContext
from gyre.algos.distill import distill_advantages, reverse_kl_tokens
from gyre.algos.estimator_table import ESTIMATORS, AdvantageEstimator, AdvantageSpec
from gyre.algos.kl import AdaptiveKLController, kl_penalized_rewards
from gyre.algos.masks import difficulty_mask, overlong_mask, soft_overlong_penalty
from gyre.algos.mismatch import (
    divergence_filter,
    importance_weights,
    mismatch_filter,
    mismatch_metrics,
    normalize_weights,
)
from gyre.algos.stats import RunningMoments, masked_mean, masked_whiten, where_valid
from gyre.algos.value import explained_variance
from gyre.config.algorithm_schema import AlgorithmConfig, MismatchConfig
from gyre.config.derive import RunPlan
from gyre.data.batching import GroupLayout, RowMap, TurnLayout
from gyre.types import Group, TrainBatch, Trajectory


@dataclass
class AlgorithmState:
    """The estimator, looked up once, and the algorithm state carried from step to step (saved in checkpoints)."""

    estimator: AdvantageEstimator
    """The row of ``ESTIMATORS`` that ``algorithm.advantage.estimator`` names."""
    spec: AdvantageSpec
    """The ``algorithm.advantage`` section as the estimator's functions take it (its own knobs included)."""
    running: dict[str, RunningMoments] = field(default_factory=dict)
    """Running reward moments per tag (domain), for the ``running`` normalisation scopes."""
    kl: AdaptiveKLController | None = None

    @classmethod
    def create(cls, a: AlgorithmConfig) -> AlgorithmState:
        kl = AdaptiveKLController(a.kl.reward_coef, a.kl.target, a.kl.horizon) if a.kl.reward_coef > 0 else None
        return cls(ESTIMATORS.get(a.advantage.estimator), a.advantage.spec(), kl=kl)

    def to_dict(self) -> dict:
        return {"running": {k: v.to_dict() for k, v in self.running.items()},
                "kl": self.kl.to_dict() if self.kl else None}

    def load_dict(self, d: dict) -> None:
        self.running = {k: RunningMoments.from_dict(v) for k, v in d.get("running", {}).items()}
        if d.get("kl") and self.kl is not None:
            self.kl = AdaptiveKLController.from_dict(d["kl"])


def correct_mismatch(batch: TrainBatch, m: MismatchConfig) -> tuple[torch.Tensor, dict]:
    """Train-inference mismatch: a keep-mask [B, L] of the tokens the ratio and divergence filters leave in
    the loss, and importance weights into ``batch.token_weights`` (normalised over those tokens when asked).
    Needs recomputed old log-probs."""
    mask = batch.response_mask
    keep = torch.ones_like(mask)
    if batch.old_logprobs is None:
        return keep, {}
    old, behaviour = batch.old_logprobs, batch.rollout_logprobs
    metrics = mismatch_metrics(old, behaviour, mask)
    if m.filter != "none":
        keep = mismatch_filter(old, behaviour, mask, m.filter, m.ratio_low, m.ratio_high, m.diff_low, m.diff_high)
    if m.divergence != "none":
        close = divergence_filter(old, behaviour, mask, m.divergence, m.divergence_level, m.divergence_max)
        metrics["mismatch/divergence_rejected_frac"] = float(1 - masked_mean(close, mask))
        keep = keep * close
    if m.filter != "none" or m.divergence != "none":
        metrics["mismatch/filtered_frac"] = float(1 - masked_mean(keep, mask))
    if m.weight != "none":
        weights = importance_weights(old, behaviour, mask, m.weight, m.upper_bound)
        if m.normalize_weights:
            weights = normalize_weights(weights, mask * keep, m.weight)
        batch.token_weights = weights
    return keep, metrics


def estimate_advantages(batch: TrainBatch, groups: list[Group], a: AlgorithmConfig, plan: RunPlan,
                        state: AlgorithmState, max_new_tokens: int, token_keep: torch.Tensor | None = None) -> dict:
    """Fill ``batch.advantages`` (and ``returns`` for a critic, ``scores``) and narrow
    ``batch.response_mask`` to the tokens that train. ``batch`` holds ``groups`` as ``collate_groups`` lays
    them out. Returns the stage's metrics."""
    layout, rows = GroupLayout.of(groups), RowMap.of(groups, len(batch))
    trajectories = [t for g in groups for t in g.trajectories]
    raw = torch.tensor([t.reward.score for t in trajectories], dtype=torch.float32)
    truncated = torch.tensor([t.finish_reason == "length" for t in trajectories])
    metrics: dict[str, float] = {}
    scores = raw
    if plan.overlong_cache_tokens:
        penalty = soft_overlong_penalty(_model_lengths(trajectories), max_new_tokens, plan.overlong_cache_tokens)
        scores = raw + penalty
        metrics["reward/overlong_penalty"] = float(penalty.mean())
    keep = rows.expand(_sample_keep(raw, truncated, a, layout, metrics))
    context = _baseline_context(groups, layout, a, plan, state, max_new_tokens, metrics)
    s = state.spec
    rewards = _response_rewards(scores, groups, state, layout, context)
    if s.reward_clip is not None:
        rewards = rewards.clamp(-s.reward_clip, s.reward_clip)
    resp = batch.response_mask
    if state.estimator.turns is not None:
        adv, returns = _turn_advantages(batch, groups, layout, rows, rewards, state), None
    else:
        adv, returns = _token_advantages(batch, rows.expand(rewards), a, state, metrics)
    if returns is not None:  # the critic's regression targets
        batch.returns = returns
        metrics["critic/explained_variance"] = explained_variance(batch.values, returns, resp)
        metrics["returns/mean"] = float(masked_mean(returns, resp))
    if a.uses_teacher:
        adv = _distill(batch, adv, a, metrics)
    final = resp * keep[:, None] * (token_keep if token_keep is not None else 1.0)
    if s.whiten:  # over the tokens that train: REINFORCE++'s global normalisation of the returns
        adv = masked_whiten(adv, final, eps=s.std_eps, ddof=s.std_ddof)
    if s.clip is not None:
        adv = adv.clamp(-s.clip, s.clip)
    if batch.credit_scales is not None:  # attention-based credit scales the final non-negative advantages
        adv = apply_credit(adv, batch.credit_scales)
        metrics["credit/amplified_frac"] = float(masked_mean((batch.credit_scales != 1).float(), final))
    batch.advantages = where_valid(adv, final)
    batch.response_mask = final
    batch.scores = rows.expand(scores)
    if batch.critic_values is not None:
        metrics.update(critic_disagreement(batch, a, layout, rows))
    metrics.update(_advantage_stats(batch.advantages, final))
    return metrics


def critic_disagreement(batch: TrainBatch, a: AlgorithmConfig, layout: GroupLayout, rows: RowMap) -> dict:
    """AsyPPO (several critics): rank the critics' disagreement over the tokens that train, zero the
    advantages where they agree most (I^A), set ``batch.entropy_mask`` (I^H) and deal the rows to the
    critics (``batch.critic_index``). The masks come after whitening, so masked advantages stay 0."""
    values = batch.critic_values
    c = a.critic
    _, sigma = aggregate_values(values.transpose(0, 1), c.value_aggregation)
    valid = batch.response_mask
    masks = disagreement_masks(sigma, valid, c.adv_mask_low_pct, c.entropy_filter_high_pct)
    batch.advantages = batch.advantages * masks.advantage
    batch.entropy_mask = masks.entropy
    group_of = layout.group_index()
    row_groups = torch.tensor([int(group_of[e]) if e >= 0 else -1 for e in rows.trajectory])
    owners = critic_rows(row_groups, values.shape[1], c.data_division)
    batch.critic_index = torch.empty(len(batch), dtype=torch.long)
    for m, owned in enumerate(owners):
        batch.critic_index[owned] = m
    return {"asyppo/sigma_mean": float(masked_mean(sigma, valid)),
            "asyppo/adv_masked_frac": float(masked_mean(1 - masks.advantage, valid)),
            "asyppo/entropy_filtered_frac": float(masked_mean(1 - masks.entropy, valid))}


def _model_lengths(trajectories: list[Trajectory]) -> torch.Tensor:
    """[E] what the overlong penalty measures: the response's length, or for a multi-turn trajectory its
    longest model turn (each turn has the length budget; observations are not the model's)."""
    return torch.tensor([max(t.end - t.start for t in tr.turns) if tr.turns else len(tr.response_ids)
                         for tr in trajectories])


def _token_advantages(batch: TrainBatch, rewards: torch.Tensor, a: AlgorithmConfig, state: AlgorithmState,
                      metrics: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's outcome ([B] ``rewards``) on its last model token, minus the KL penalty, through the
    token-level estimator."""
    token_rewards = outcome_token_rewards(rewards, batch.response_mask)
    token_rewards = _kl_penalty(batch, token_rewards, a, state, metrics)
    return state.estimator.advantages(token_rewards, batch.values, batch.response_mask, state.spec)


def _turn_advantages(batch: TrainBatch, groups: list[Group], layout: GroupLayout, rows: RowMap,
                     rewards: torch.Tensor, state: AlgorithmState) -> torch.Tensor:
    """One advantage per model turn (``TurnRecord`` rewards and states, [E] response-level ``rewards``),
    spread over the turn's tokens in the rows that train it."""
    every = [t for g in groups for t in g.trajectories]
    single = [t for t in every if not t.turns]
    if single:
        whole = [n for n in ESTIMATORS.names if ESTIMATORS.get(n).turns is None]
        raise ValueError(f"algorithm.advantage.estimator={state.spec.estimator} assigns credit to the turns of "
                         "multi-turn episodes, but "
                         f"{len(single)} of {len(every)} trajectories have no turns (e.g. {single[0].prompt.uid}#"
                         f"{single[0].sample_index}, a single response); learn from an environment, or choose a "
                         f"trajectory-level estimator ({', '.join(whole)})")
    turn_rewards, mask, states = TurnLayout.of(groups).padded()
    inputs = TurnBatch(turn_rewards, mask, rewards, layout.group_index(), states)
    per_turn = state.estimator.turns(inputs, state.spec)
    return rows.broadcast(per_turn.to(torch.float32), batch.response_mask.shape[1])


def _sample_keep(raw: torch.Tensor, truncated: torch.Tensor, a: AlgorithmConfig, layout: GroupLayout,
                 metrics: dict) -> torch.Tensor:
    keep = torch.ones_like(raw)
    if a.masks.overlong:
        over = overlong_mask(truncated)
        metrics["mask/overlong_frac"] = float(1 - over.mean())
        keep = keep * over
    if a.masks.difficulty is not None:
        low, high = a.masks.difficulty
        diff = layout.scatter(difficulty_mask(layout.gather(raw), low, high))
        metrics["mask/difficulty_frac"] = float(1 - diff.mean())
        keep = keep * diff
    metrics["mask/kept_frac"] = float(keep.mean())
    return keep


def _baseline_context(groups: list[Group], layout: GroupLayout, a: AlgorithmConfig, plan: RunPlan,
                      state: AlgorithmState, max_new_tokens: int, metrics: dict) -> BaselineContext:
    """What baselines read besides the rewards: each response's model tokens (OPO), each prompt's greedy
    response's reward, shaped like the samples' (ReMax), and k (pass@k)."""
    lengths = torch.tensor([sum(len(s.token_ids) for s in t.segments if s.trainable)
                            for g in groups for t in g.trajectories])
    greedy = None
    if state.estimator.greedy:
        missing = [g.group_id for g in groups if g.greedy is None or g.greedy.reward is None]
        if missing:
            raise ValueError(f"algorithm.advantage.estimator={a.advantage.estimator} takes each prompt's greedy "
                             "response as its baseline, "
                             f"but {len(missing)} group(s) have no scored one (e.g. {missing[0]}); the rollout "
                             "generates it when the run's schedule asks for it (gyre.rollout.schedule.schedule_spec)")
        baselines = [g.greedy for g in groups]
        greedy = torch.tensor([t.reward.score for t in baselines], dtype=torch.float32)
        if plan.overlong_cache_tokens:
            greedy = greedy + soft_overlong_penalty(_model_lengths(baselines), max_new_tokens,
                                                    plan.overlong_cache_tokens)
        metrics["reward/greedy_mean"] = float(greedy.mean())
    return BaselineContext(layout.gather(lengths), greedy)


def _response_rewards(scores: torch.Tensor, groups: list[Group], state: AlgorithmState, layout: GroupLayout,
                      context: BaselineContext) -> torch.Tensor:
    """Response-level rewards after the estimator's baseline / normalisation, [B]."""
    rows = layout.gather(scores)
    baseline, s = state.estimator.baseline, state.spec
    if "running" not in (s.norm_mean, s.norm_std):
        return layout.scatter(baseline(rows, s, context=context))
    # Running moments are kept per tag (domain): the trajectories of one group share its prompt's tag.
    tags = [g.prompt.tag or "default" for g in groups]
    out = torch.zeros_like(rows)
    for tag in sorted(set(tags)):
        idx = torch.tensor([i for i, t in enumerate(tags) if t == tag])
        moments = state.running.setdefault(tag, RunningMoments())
        moments.update(rows[idx])
        out[idx] = baseline(rows[idx], s, moments, context.rows(idx))
    return layout.scatter(out)


def _kl_penalty(batch: TrainBatch, token_rewards: torch.Tensor, a: AlgorithmConfig, state: AlgorithmState,
                metrics: dict) -> torch.Tensor:
    """r_t - beta * KL_t (pi_old against the reference), and the adaptive update of beta."""
    if state.kl is None:
        return token_rewards
    policy = batch.old_logprobs if batch.old_logprobs is not None else batch.rollout_logprobs
    coef = state.kl.coef
    shaped, kl = kl_penalized_rewards(token_rewards, policy, batch.ref_logprobs, batch.response_mask, coef,
                                      a.kl.reward_estimator, a.kl.clamp)
    observed = float(masked_mean(kl, batch.response_mask))
    state.kl.update(observed, len(batch))
    metrics.update({"kl_reward/kl": observed, "kl_reward/coef": coef})
    return shaped


def _distill(batch: TrainBatch, adv: torch.Tensor, a: AlgorithmConfig, metrics: dict) -> torch.Tensor:
    """On-policy distillation against the teacher's log-probs of the sampled tokens: the advantages of the
    pure and advantage modes (the loss mode adds its term in the trainer), and the reverse KL to the
    teacher, measured at the weights that generated the batch (``distill/reverse_kl``)."""
    if batch.teacher_logprobs is None:
        raise ValueError("algorithm.distill.coef > 0 but the batch has no teacher log-probs (no teacher role ran)")
    student = batch.old_logprobs if batch.old_logprobs is not None else batch.rollout_logprobs
    mask = batch.response_mask
    metrics["distill/reverse_kl"] = float(masked_mean(reverse_kl_tokens(student, batch.teacher_logprobs, mask), mask))
    if a.distill.mode == "loss":
        return adv
    return distill_advantages(adv, student, batch.teacher_logprobs, mask, a.distill.coef, a.distill.mode == "pure")


def _advantage_stats(adv: torch.Tensor, mask: torch.Tensor) -> dict:
    if mask.sum() == 0:
        return {"advantages/mean": 0.0, "advantages/std": 0.0, "advantages/max": 0.0, "advantages/min": 0.0}
    valid = adv[mask.bool()]
    return {"advantages/mean": float(valid.mean()), "advantages/std": float(valid.std()) if valid.numel() > 1 else 0.0,
            "advantages/max": float(valid.max()), "advantages/min": float(valid.min())}
