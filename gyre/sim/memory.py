"""Whether a simulated setting fits its devices: ``gyre check``'s memory estimate on the simulated layout.

The simulator places a config on its own number of devices (``scenario.layout``: colocated on all of them,
or rollout and training side by side), so the estimate (``gyre.config.memory.estimate``: weights, gradients,
optimizer state sharded over the trainer's ranks, activations, logits, the engines' KV cache, the weight
channel's staging) is taken on the config with its device lists rewritten to that layout, for the
simulated model shape and the device class's memory. A setting past the estimate's headroom is refused
with the numbers, as ``gyre check`` would refuse the run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gyre.config.catalog import DeviceClass, ModelShape
from gyre.config.devices import shared_devices
from gyre.config.memory import GB, HEADROOM, estimate
from gyre.config.schema import RLVRConfig
from gyre.sim.run import Layout, SimSpec


@dataclass(frozen=True)
class MemoryFit:
    roles: dict[str, str]
    """Each model role's estimate per device, with its terms (``RoleMemory.describe``)."""
    peak_gb: float
    """The most loaded device's estimate."""
    device_gb: float
    problems: tuple[str, ...]
    train_gb: float = 0.0
    """The training side on one of its devices: the trainer roles (policy, reference, teacher, critics), the
    largest when they offload in turn, else their sum."""
    rollout_gb: float = 0.0
    """The rollout side on one of its devices: an engine (0 under hybrid rollout: the policy ranks sample)."""
    largest: tuple[str, str] = ("policy", "")
    """The largest role's name and its largest term (``logits 59.8 GB``): what the refusal says to change."""

    @property
    def fits(self) -> bool:
        return not self.problems

    def refusal(self, device: str) -> str:
        roles = "; ".join(f"{role} {text}" for role, text in self.roles.items())
        role, term = self.largest
        section = role.split(".")[0]
        return (f"does not fit {device} ({self.device_gb:.0f} GB a device, {HEADROOM:.0%} usable): about "
                f"{self.peak_gb:.1f} GB on its most loaded device ({roles}); the largest is {role}"
                f"{f' ({term})' if term else ''}: {_ADVICE.get(section, _ADVICE['policy']).format(section)}, or "
                "simulate more devices or a larger device class")


_ADVICE = {
    "policy": "shard it over more devices (policy.strategy=fsdp2), lower policy.micro_batch_tokens (or "
              "micro_batch_size), set policy.logprob_chunk_tokens, or turn on model.gradient_checkpointing",
    "critic": "shard it (critic.strategy=fsdp2), lower critic.micro_batch_tokens (or micro_batch_size), or turn on "
              "model.gradient_checkpointing",
    "reference": "lower {0}.micro_batch_size (or set {0}.micro_batch_tokens), or set {0}.logprob_chunk_tokens",
    "rollout": "lower rollout.max_batch_size or rollout.max_batch_tokens (vLLM: rollout.gpu_memory_utilization), "
               "or spread an engine over more devices (simulate.rollout_tp)",
}
_ADVICE["teacher"] = _ADVICE["reference"]


def placed_config(cfg: RLVRConfig, placed: Layout) -> RLVRConfig:
    """``cfg`` with its device lists as ``placed`` puts them: every role on all devices (colocated), or the
    rollout engines first and the trainer's roles (reference, critic) on the rest."""
    n = placed.devices
    rollout = tuple(range(n)) if placed.colocated else tuple(range(placed.rollout_devices))
    train = tuple(range(n)) if placed.colocated else tuple(range(placed.rollout_devices, n))
    mode = cfg.rollout.mode if placed.colocated else "separate"
    return cfg.model_copy(update={
        "rollout": cfg.rollout.model_copy(update={"devices": rollout, "mode": mode}),
        "policy": cfg.policy.model_copy(update={"devices": train}),
        "reference": cfg.reference.model_copy(update={"devices": train}),
        "critic": cfg.critic.model_copy(update={"devices": train}),
        "teacher": cfg.teacher.model_copy(update={"devices": train}),
    })


@dataclass(frozen=True)
class _Placement:
    """What the estimate reads of a run plan (``RunPlan``), for the simulated layout: the simulator picks
    layouts (an asynchronous split of a colocated config) whose batch a run would have to fit to its ranks
    first, so ``make_plan``'s checks do not apply; the memory does."""

    roles: dict[str, tuple[int, ...]]
    hybrid_rollout: bool
    weight_transport: str
    offload: bool
    device_kind: str = "cuda"


def spec_fit(cfg: RLVRConfig, spec: SimSpec) -> tuple[MemoryFit | None, str]:
    """The estimate of ``cfg`` simulated as ``spec``, and the device class it names: with rollout pools of their
    own classes (``simulate.rollout_pools``), each side is judged on its own class's memory (the training
    devices on the trainer's, each pool's on its own), the first that does not fit reported."""
    model, transport = spec.cost.model, spec.cost.transport
    if not spec.pools:
        return memory_fit(cfg, spec.layout, model, spec.cost.device, transport), spec.cost.device.name
    lay, start, sides = spec.layout, 0, []
    for p in spec.pools:
        sides.append((p.cost.device, range(start, start + p.devices)))
        start += p.devices
    sides.insert(0, (spec.trainer.device, range(lay.rollout_devices, lay.devices)))
    fits = [(memory_fit(cfg, lay, model, device, transport, only), device.name) for device, only in sides]
    if any(f is None for f, _ in fits):
        return None, spec.trainer.device.name
    bad = next(((f, name) for f, name in fits if not f.fits), None)
    if bad is not None:
        return bad
    train, name = fits[0]
    return replace(train, rollout_gb=max(f.rollout_gb for f, _ in fits[1:])), name


def memory_fit(cfg: RLVRConfig, placed: Layout, shape: ModelShape, device: DeviceClass,
               transport: str | None, only: range | None = None) -> MemoryFit | None:
    """The estimate of ``cfg`` placed as ``placed`` with ``shape`` on ``device``s, the weights moving by
    ``transport`` (``only``: judge those devices alone, the others being of another class); None on CPU
    slots (host memory, no verdict)."""
    if device.kind != "cuda":
        return None
    c = placed_config(cfg, placed)
    a, hybrid = c.algorithm, c.rollout.mode == "hybrid"
    roles = {"policy": c.policy.devices} if hybrid else {"policy": c.policy.devices, "rollout": c.rollout.devices}
    if a.uses_reference and c.policy.lora is None:
        roles["reference"] = c.reference.devices
    if a.uses_teacher:
        roles["teacher"] = c.teacher.devices
    if a.uses_critic:
        roles.update({f"critic.{m}" if c.critic.num_critics > 1 else "critic": c.critic.devices
                      for m in range(c.critic.num_critics)})
    mode = c.policy.offload  # as make_plan decides it: roles sharing GPUs take turns unless told not to
    offload = mode == "always" or (mode == "auto" and bool(shared_devices(roles)))
    plan = _Placement(roles, hybrid, transport or "object_store", offload=offload)
    memory = estimate(c, plan, shape, device.mem_gb)
    if only is not None:
        memory = replace(memory, devices={d: v for d, v in memory.devices.items() if d in only})
    peak = max(memory.devices.values(), default=0.0)
    trainers = [m.total for m in memory.roles if m.role != "rollout"]  # all on the training devices
    rollout = sum(m.total for m in memory.roles if m.role == "rollout")
    big = max(memory.roles, key=lambda m: m.total)
    name, value = max(big.terms.items(), key=lambda kv: kv[1])
    return MemoryFit({m.role: m.describe() for m in memory.roles}, peak / GB, device.mem_gb,
                     tuple(memory.problems()), (max(trainers) if offload else sum(trainers)) / GB, rollout / GB,
                     (big.role, f"{name} {value / GB:.1f} GB"))
