"""Create the Ray role groups of a run on their devices and connect the trainer ranks."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gyre.cluster.colocation import TimeShare
from gyre.cluster.faults import Watchdog
from gyre.cluster.group import RoleGroup, starter
from gyre.cluster.placement import Placement, create_placement
from gyre.cluster.workers import (
    CriticWorker,
    EnvWorker,
    HybridRollout,
    ModelRewardWorker,
    PolicyWorker,
    ReferenceWorker,
    RewardWorker,
    RolloutWorker,
    TrainerRank,
)
from gyre.config.derive import RunPlan
from gyre.config.schema import ModelConfig, RLVRConfig
from gyre.engines.specs import MemoryLevers
from gyre.engines.trainer import TrainerSpec
from gyre.rewards.registry import function_spec

log = logging.getLogger(__name__)


@dataclass
class Roles:
    policy: RoleGroup
    rollout: RoleGroup
    reward: dict[str, RoleGroup]
    """The reward workers of each domain (function workers, a judge or a reward model)."""
    reference: RoleGroup | None
    critics: tuple[RoleGroup, ...]
    """The critic role groups, named as ``RunPlan.critic_roles``: none, PPO's one, or AsyPPO's several."""
    timeshare: TimeShare
    placement: Placement
    watchdog: Watchdog
    """Deadlines of every role call of the run (shared by the groups)."""
    envs: RoleGroup | None = None
    """Environment workers of an agentic run (CPU-only, placed anywhere)."""
    teacher: RoleGroup | None = None
    """The on-policy distillation teacher (reference workers on teacher.model_path)."""
    lend_rollout: Callable[[], Any] | None = None
    """Starts one lent rollout engine outside the run's devices (rollout.elastic), else None."""

    @property
    def hybrid(self) -> bool:
        """The policy ranks are the rollout engines (rollout.mode hybrid)."""
        return self.rollout is self.policy

    @property
    def rollout_role(self) -> str:
        """The role to activate on the devices before sampling."""
        return "policy" if self.hybrid else "rollout"

    def activate_rollout(self, fresh: bool = False, lora: bool = False) -> None:
        """Give the rollout engines their devices (the time-share). ``fresh``: a whole new version loads next,
        so separate engines skip bringing their old weights back (not with LoRA, whose updates merge into
        them; hybrid engines are the policy, whose weights are the ones that trained)."""
        self.timeshare.activate(self.rollout_role, values=not (fresh and not lora and not self.hybrid))

    def groups(self) -> list[RoleGroup]:
        """Every role group of the run, once each (a hybrid run's policy is its rollout too)."""
        groups = (self.policy, self.rollout, self.reference, *self.critics, self.teacher, *self.reward.values(),
                  self.envs)
        return list({id(g): g for g in groups if g is not None}.values())

    def kill(self) -> None:
        """Stop every actor and release the devices (the cluster may outlive this run)."""
        from ray.util.placement_group import remove_placement_group

        if self.envs is not None and len(self.envs.live):  # closed first: their processes' scratch goes with them
            try:
                self.envs.call(EnvWorker.close)
            except Exception as exc:  # noqa: BLE001 - best effort: a dead worker's scratch is swept later
                log.warning("closing the environment workers failed (%s); killing them", exc)
        for group in self.groups():
            group.kill()
        remove_placement_group(self.placement.group)


def build_roles(cfg: RLVRConfig, plan: RunPlan, watchdog: Watchdog | None = None) -> Roles:
    """Create every role's actors and connect the trainer ranks; on failure release what was made.
    ``watchdog`` (default: from the config) gives every role call its deadline."""
    placement = create_placement(plan)
    made: list[RoleGroup] = []
    watchdog = watchdog or Watchdog.from_config(cfg.watchdog)
    watchdog.rebuilt()
    try:
        return _build(cfg, plan, placement, made, watchdog)
    except BaseException:
        from ray.util.placement_group import remove_placement_group

        for group in made:
            group.kill()
        remove_placement_group(placement.group)
        raise


def _build(cfg: RLVRConfig, plan: RunPlan, placement: Placement, made: list[RoleGroup], watchdog: Watchdog) -> Roles:
    m = cfg.model
    tok_path = m.tokenizer_path or m.path
    threads = plan.threads_per_worker
    # With offload, only the policy starts on its devices; colocated roles load when first activated.
    off = plan.offload
    spec = policy_trainer_spec(m, cfg.policy.strategy, cfg.policy.micro_batch_size, cfg.policy.lora, cfg.run.seed,
                               cfg.policy.levers)
    r = cfg.rollout
    hybrid = HybridRollout(tok_path, m.trust_remote_code, r.max_batch_size, r.max_batch_tokens,
                           r.max_prefill_tokens, r.gpu_memory_utilization) if plan.hybrid_rollout else None
    policy = RoleGroup.create("policy", PolicyWorker, placement, lambda r: (
        (r, plan.dp_size, spec, plan.device_kind, threads, cfg.run.seed, hybrid), {}))
    made.append(policy)
    if hybrid is not None:
        rollout = policy
    else:
        rollout = RoleGroup.create("rollout", RolloutWorker, placement, lambda r: (
            rollout_worker_args(cfg, r, m.path, plan.device_kind, threads, off), {}))
        made.append(rollout)
    reference = None
    if "reference" in plan.roles:  # LoRA scores the reference on the policy ranks (adapters off)
        reference = RoleGroup.create("reference", ReferenceWorker, placement, lambda r: (
            (r, m.path, m.dtype, m.trust_remote_code, plan.device_kind, threads, cfg.reference.micro_batch_size,
             off, m.attn_implementation, cfg.reference.levers), {}))
        made.append(reference)
    teacher = _build_teacher(cfg, plan, placement, made) if plan.use_teacher else None
    critics = _build_critics(cfg, plan, placement, made)
    reward = _build_rewards(cfg, plan, placement, made) if cfg.env is None else {}
    envs = _build_envs(cfg, made) if cfg.env is not None else None
    for group in made:
        group.watchdog = watchdog
    for trainer in (policy, *critics):
        connect_trainer(trainer)
    groups = {"policy": policy} if hybrid else {"policy": policy, "rollout": rollout}
    if reference is not None:
        groups["reference"] = reference
    groups.update(zip(plan.critic_roles, critics, strict=True))
    if teacher is not None:
        groups["teacher"] = teacher
    # Trainer roles load onto their devices at setup; the others start offloaded when the plan offloads.
    resident = {"policy", *plan.critic_roles} & set(groups) if off else set(groups)
    lend = _lend_rollout(cfg, plan, len(rollout)) if cfg.rollout.elastic is not None else None
    return Roles(policy, rollout, reward, reference, critics, TimeShare(plan, groups, resident), placement, watchdog,
                 envs, teacher, lend)


def lent_engine_resources(cfg: RLVRConfig, device_kind: str) -> dict:
    """The Ray options of one lent rollout engine: its device (tensor_parallel_size GPUs, or a CPU slot) and
    rollout.elastic.resources."""
    r = cfg.rollout
    options: dict = {"num_cpus": 1}
    if device_kind == "cuda":
        options["num_gpus"] = r.tensor_parallel_size
    if r.elastic.resources:
        options["resources"] = dict(r.elastic.resources)
    return options


def _lend_rollout(cfg: RLVRConfig, plan: RunPlan, base: int) -> Callable[[], Any]:
    """Lent engines are numbered after the base pool (their sampling seeds differ from every other's)."""
    start = starter(RolloutWorker, lent_engine_resources(cfg, plan.device_kind), lambda rank: rollout_worker_args(
        cfg, rank, cfg.model.path, plan.device_kind, plan.threads_per_worker, False))
    numbers = itertools.count(base)
    return lambda: start(next(numbers))


def policy_trainer_spec(m: ModelConfig, strategy: str, micro_batch_size: int, lora=None, seed: int = 0,
                        levers: MemoryLevers | None = None) -> TrainerSpec:
    """The trainer of the policy (RL, or a standalone SFT run) on ``m``, with LoRA adapters when ``lora`` is
    a ``policy.lora`` section (``seed`` initialises them alike on every rank) and the memory ``levers``."""
    lora = lora.spec() if lora is not None else None
    return TrainerSpec(model_path=m.path, dtype=m.dtype, trust_remote_code=m.trust_remote_code,
                       gradient_checkpointing=m.gradient_checkpointing, strategy=strategy,
                       micro_batch_size=micro_batch_size, attn_implementation=m.attn_implementation,
                       lora=lora, seed=seed, levers=levers or MemoryLevers())


def rollout_worker_args(cfg: RLVRConfig, rank: int, model_path: str, device_kind: str, threads: int,
                        offloaded: bool) -> tuple:
    """A ``RolloutWorker``'s constructor arguments: the model at ``model_path`` with the run's tokenizer,
    dtype and engine settings."""
    m = cfg.model
    r = cfg.rollout
    return (rank, model_path, m.tokenizer_path or model_path, m.dtype, m.trust_remote_code, device_kind, threads,
            r.max_batch_size, offloaded, m.attn_implementation, r.backend, cfg.run.seed, r.max_batch_tokens,
            r.max_prefill_tokens, r.tensor_parallel_size, r.gpu_memory_utilization)


def reward_worker_args(domain) -> tuple:
    """A ``RewardWorker``'s constructor arguments for a function-run reward domain."""
    spec, kwargs = function_spec(domain)
    return spec, kwargs, domain.sample_timeout_s, domain.processes


def connect_trainer(group: RoleGroup) -> None:
    """Join a trainer role's ranks into a process group of their own (rank 0 picks the address) and load
    the model on each."""
    addr, port = group.gather([group.submit_to(0, TrainerRank.rendezvous)], TrainerRank.rendezvous)[0]
    group.call(TrainerRank.setup, addr, port)


def _build_envs(cfg: RLVRConfig, made: list[RoleGroup]) -> RoleGroup:
    """``env.workers`` CPU actors hosting ``env.slots_per_worker`` environments each (restarted if they die)."""
    from gyre.envs.host import EnvSpec

    e = cfg.env
    kwargs = e.build_kwargs(cfg.rollout.sampling.temperature, cfg.rollout.sampling.top_p)
    spec = EnvSpec(e.id, kwargs, e.max_observation_chars, tuple(e.tools), e.tool_format, e.max_tool_calls)
    group = RoleGroup.create_unplaced("env", EnvWorker, e.workers, e.worker_cpus,
                                      (spec, e.slots_per_worker, e.reset_timeout_s, e.step_timeout_s))
    made.append(group)
    return group


def _build_rewards(cfg: RLVRConfig, plan: RunPlan, placement: Placement, made: list[RoleGroup]) -> dict:
    """Function domains: ``workers`` CPU actors each (restarted if they die). A local judge or a reward
    model: one actor per device of its role, placed like any model role."""
    groups = {}
    for name, domain in cfg.reward.domains.items():
        if domain.model_role is None:
            group = RoleGroup.create_unplaced(f"reward.{name}", RewardWorker, domain.workers, 1,
                                              reward_worker_args(domain), max_restarts=3)
        else:
            kind, model = domain.model_role, domain.scoring_model
            group = RoleGroup.create(f"{kind}.{name}", ModelRewardWorker, placement, lambda r, k=kind, m=model: (
                (k, m, plan.device_kind, plan.threads_per_worker, cfg.model.dtype), {}))
        made.append(group)
        groups[name] = group
    return groups


def _build_teacher(cfg: RLVRConfig, plan: RunPlan, placement: Placement, made: list[RoleGroup]) -> RoleGroup:
    """Reference workers on the teacher's model: frozen log-probs, offloaded like the reference."""
    m, t = cfg.model, cfg.teacher
    teacher = RoleGroup.create("teacher", ReferenceWorker, placement, lambda r: (
        (r, t.model_path, m.dtype, m.trust_remote_code, plan.device_kind, plan.threads_per_worker,
         t.micro_batch_size, plan.offload, m.attn_implementation, t.levers), {}))
    made.append(teacher)
    return teacher


def _build_critics(cfg: RLVRConfig, plan: RunPlan, placement: Placement,
                   made: list[RoleGroup]) -> tuple[RoleGroup, ...]:
    """One role group per critic of the plan, each its own model copy and ranks; critic m's value head is
    seeded apart from the others' (m = 0 as PPO's one critic), so critics differ from the start."""
    m, c = cfg.model, cfg.critic
    spec = TrainerSpec(model_path=c.model_path or m.path, dtype=m.dtype, trust_remote_code=m.trust_remote_code,
                       gradient_checkpointing=m.gradient_checkpointing, strategy=c.strategy,
                       micro_batch_size=c.micro_batch_size, head="value", attn_implementation=m.attn_implementation,
                       levers=c.levers)
    critics = []
    for index, name in enumerate(plan.critic_roles):
        seed = cfg.run.seed + 7919 * (index + 1)
        critic = RoleGroup.create(name, CriticWorker, placement, lambda r, s=seed: (
            (r, plan.critic_dp_size, spec, plan.device_kind, plan.threads_per_worker, s), {}))
        made.append(critic)
        critics.append(critic)
    return tuple(critics)


def reward_scorers(cfg: RLVRConfig, groups: dict[str, RoleGroup]) -> dict:
    """The reward pool's view of each domain: its workers (``groups``, by domain), retries and (code)
    adaptive timeout."""
    from gyre.cluster.reward_pool import DomainScorer

    scorers = {}
    if cfg.env is not None:  # the environments pay the rewards
        return scorers
    for name, domain in cfg.reward.domains.items():
        adaptive = None
        if domain.adaptive_timeout is not None:
            from gyre.rewards.code import AdaptiveTimeout

            a = domain.adaptive_timeout
            adaptive = AdaptiveTimeout(a.t_min, a.t_max, a.lam)
        scorers[name] = DomainScorer(name, groups[name], domain.retries, adaptive)
    return scorers
