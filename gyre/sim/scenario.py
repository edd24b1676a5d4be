"""From a run config to a simulation: the same scheduler rules, a cluster of the planned size.

``scenario(cfg)`` reads the config as ``gyre train`` would (``gyre.rollout.schedule.schedule_spec``
gives the scheduler's rules, so a simulated step runs exactly the run's admission, asynchrony, queueing,
redundancy, filters and tail batching) and the ``simulate`` section for what the config cannot say: the
device count and class, the model size and the task's shape.

Placement follows the config: rollout and policy on overlapping devices time-share them (colocated);
disjoint lists run side by side with the same share of the devices. Asynchrony needs disjoint devices,
so an asynchronous setting of a colocated config is simulated disaggregated (``simulate.rollout_share``),
as a run would have to be placed; the table names each setting's layout.

Decoding and weight updates cost what gyre's own engine and transport would (``engine_and_transport``):
the config's rollout.backend (a hybrid layout samples with the policy's HF model), and the transport
``gyre check`` resolves for the simulated placement (``gyre.config.backend.weight_transport``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gyre.config.backend import backend_notes, weight_transport
from gyre.config.catalog import DeviceClass, ModelShape, device_class, engine_class, model_shape
from gyre.config.memory import VLLM_SHARE
from gyre.config.schema import RLVRConfig
from gyre.envs.episode import EpisodeLimits
from gyre.rollout.schedule import sampling_params, schedule_spec
from gyre.sim.cost import CostModel
from gyre.sim.elastic import ElasticSpec
from gyre.sim.learner import sim_learner
from gyre.sim.run import Agentic, Layout, Pool, SimSpec
from gyre.sim.workload import WorkloadSpec
from gyre.training.plan import step_passes

ASYNC_SHARE = 0.6
"""Rollout's share of the devices when asynchrony splits a colocated config (ROLL Flash: 24 of 40)."""


def rollout_tp(cfg: RLVRConfig) -> int:
    """Devices per simulated rollout engine: simulate.rollout_tp, else the run's rollout.tensor_parallel_size."""
    return cfg.simulate.rollout_tp or cfg.rollout.tensor_parallel_size


def layout(cfg: RLVRConfig, devices: int) -> Layout:
    """Where rollout and training run on ``devices`` devices, after the config's placement."""
    sim, r = cfg.simulate, cfg.rollout
    tp = rollout_tp(cfg)
    rollout, policy = set(r.devices), set(cfg.policy.devices)
    overlap = bool(rollout & policy) or r.mode == "hybrid"
    if overlap and r.async_ratio == 0:
        if devices < tp:
            raise ValueError(f"{devices} devices cannot hold a rollout engine of simulate.rollout_tp={tp} devices")
        return Layout(devices, devices, devices, True, tp)
    share = sim.rollout_share or (ASYNC_SHARE if overlap else len(rollout) / (len(rollout) + len(policy)))
    engines = max(1, round(devices * share / tp))
    if devices - engines * tp < 1:
        engines = (devices - 1) // tp
    if engines < 1:
        raise ValueError(f"{devices} devices cannot hold a rollout engine ({tp} devices) and a trainer side by side "
                         f"(rollout and training are disaggregated here): simulate more devices")
    return Layout(devices, engines * tp, devices - engines * tp, False, tp)


def engine_and_transport(cfg: RLVRConfig, placed: Layout, device: DeviceClass) -> tuple[str, str]:
    """The rollout backend and weight transport a run of ``cfg`` placed as ``placed`` would use: hybrid
    (rollout.mode, on a colocated layout) samples with the policy ranks' HF model and moves nothing (FSDP2
    ranks gather a full copy); otherwise rollout.backend, and the transport auto picks where an engine does
    or does not share the policy rank 0's device (raising as ``gyre check`` would)."""
    hybrid = cfg.rollout.mode == "hybrid" and placed.colocated
    backend_notes(cfg.rollout.backend, hybrid)  # refuses vLLM for hybrid rollout
    if hybrid:
        return "hf", "gather" if cfg.policy.strategy == "fsdp2" else "none"
    return cfg.rollout.backend, weight_transport(cfg, False, device.kind, [], shared=placed.colocated)


def scenario(cfg: RLVRConfig, devices: int | None = None, calibrate: str | Path | None = None) -> SimSpec:
    """The simulation of ``cfg`` on ``devices`` devices (default ``simulate.devices``); ``calibrate``: a
    real run's directory (the device, prompts, reward latency and response lengths fitted to it:
    ``calibration``), or its metrics.jsonl (the response lengths alone)."""
    sim = cfg.simulate
    sampling = sampling_params(cfg)
    model = sim_model(cfg)
    fitted = None
    if sim.rollout_pools:
        placed, backend, devices_of = pooled(cfg, devices or sim.devices, model, calibrate)
    else:
        placed = layout(cfg, devices or sim.devices)
        fitted = calibration(cfg, calibrate) if calibrate is not None else None
        device = fitted.device if fitted is not None and fitted.device is not None else device_class(sim.device)
        backend, transport = engine_and_transport(cfg, placed, device)
        cost = CostModel(device, model, rollout_tp(cfg), engine_class(backend, device), transport,
                         same_node=placed.devices <= device.node_devices)
        devices_of = {"cost": cost, "kv_tokens": kv_budget(cfg, cost)}
    w = sim.workload
    workload = WorkloadSpec(w.prompt_tokens, w.prompt_tokens_cv, w.response_tokens, w.length_sigma, w.prompt_share,
                            sampling.max_new_tokens, w.pass_rate, w.reward_latency_s, w.reward_latency_cv, w.turns,
                            w.turns_cv, w.turn_tokens, w.observation_tokens, w.env_latency_s, w.env_latency_cv,
                            w.reset_latency_s, w.env_failure_rate, w.env_hang_rate)
    recorded = None
    if fitted is not None:
        workload, recorded = fitted.workload(workload, sampling.max_new_tokens), fitted.recorded
    agentic = None
    if cfg.env is not None:
        e = cfg.env
        limits = EpisodeLimits(e.max_turns, e.turn_tokens, e.context_tokens, e.observation_tokens, e.window)
        agentic = Agentic(limits, sim.env_slots or e.workers * e.slots_per_worker, sim.env_latency_scale, e.turn_sync,
                          e.max_failures, e.reset_timeout_s, e.step_timeout_s)
        workload = replace(workload, max_tokens=e.turn_tokens)
    schedule = schedule_spec(cfg, sampling)
    slots = sim.max_rows or cfg.rollout.max_batch_size
    if schedule.async_ratio > 0 and not schedule.lockstep and slots:  # as training does (schedule_spec)
        schedule = replace(schedule, engine_slots=slots)
    # vLLM's max_num_seqs is 256 unless rollout.max_batch_size sets it (the scheduler is not told: a run's is
    # not); gyre's HF engine takes what its budget holds.
    max_rows = slots or (256 if backend == "vllm" else None)
    return SimSpec(schedule, placed, workload=workload,
                   steps=sim.steps, warmup=min(sim.warmup_steps, sim.steps - 1), partial=cfg.rollout.partial,
                   max_rows=max_rows, reward_workers=sim.reward_workers,
                   passes=step_passes(cfg).forward_equivalents(), agentic=agentic, seed=sim.seed,
                   padding=cfg.policy.remove_padding, micro_batch=cfg.policy.micro_batch_size,
                   learner=sim_learner(cfg, placed.train_devices, model),
                   elastic=elastic_spec(cfg), env_price_per_hour=sim.env_price_per_hour,
                   recorded=recorded, **devices_of)


def pooled(cfg: RLVRConfig, train_devices: int, model: ModelShape,
           calibrate: str | Path | None) -> tuple[Layout, str, dict]:
    """``cfg``'s layout, rollout backend and device costs (``SimSpec``'s cost, kv_tokens, train_cost, pools)
    with its rollout on ``simulate.rollout_pools`` (each its device class) beside ``train_devices`` devices of
    ``simulate.device`` that train: disaggregated, the weights crossing nodes (classes are separate nodes) by
    the transport ``gyre check`` resolves for disjoint devices, each pool's engines costing and holding what
    their class does."""
    sim, tp = cfg.simulate, rollout_tp(cfg)
    if calibrate is not None:
        raise ValueError("--calibrate fits one device class: simulate.rollout_pools names several (drop one of them)")
    if cfg.rollout.mode == "hybrid":
        raise ValueError("simulate.rollout_pools puts rollout on devices of its own, but rollout.mode=hybrid samples "
                         "with the policy's ranks: set rollout.mode=separate")
    for p in sim.rollout_pools:
        if p.devices % tp:
            raise ValueError(f"simulate.rollout_pools: {p.devices} {p.device} devices are not whole engines of "
                             f"{tp} devices (rollout tensor parallelism): use a multiple of {tp}")
    rollout = sum(p.devices for p in sim.rollout_pools)
    placed = Layout(train_devices + rollout, rollout, train_devices, False, tp,
                    (*(f"{p.devices} {p.device}" for p in sim.rollout_pools), sim.device))
    trainer = device_class(sim.device)
    backend, transport = engine_and_transport(cfg, placed, trainer)

    def cost(device: DeviceClass) -> CostModel:
        return CostModel(device, model, tp, engine_class(backend, device), transport, same_node=False)

    pools = tuple(Pool(c, p.devices, kv_budget(cfg, c))
                  for p in sim.rollout_pools for c in [cost(device_class(p.device))])
    return placed, backend, {"cost": pools[0].cost, "kv_tokens": pools[0].kv_tokens, "train_cost": cost(trainer),
                             "pools": pools}


def sim_model(cfg: RLVRConfig) -> ModelShape:
    """The simulated model: simulate.model, or (``config``) the run's own model.path."""
    sim = cfg.simulate
    return ModelShape.from_hf_config(cfg.model.path) if sim.model == "config" else model_shape(sim.model)


def calibration(cfg: RLVRConfig, calibrate: str | Path):
    """The fit of a real run (``gyre.sim.calibrate``) for simulating ``cfg``, cached per run: its
    ``report()`` says what was fitted, from how many spans, and what was not."""
    from gyre.sim.calibrate import calibrate as fit

    return fit(calibrate, device_class(cfg.simulate.device), sim_model(cfg))


def kv_budget(cfg: RLVRConfig, cost: CostModel) -> float | None:
    """Tokens of KV cache a rollout engine of ``cfg`` may fill, as the run's engine decides it, on a GPU:
    vLLM pages its cache within rollout.gpu_memory_utilization (0.9 unset) of its devices less the weights;
    gyre's HF engine within what that share leaves beside the weights when it is set, and within
    rollout.max_batch_tokens (on CPUs too). None where the run's engine sets none (the HF engine without
    either, a CPU's vLLM): the simulated engine then holds what the device holds beside the weights."""
    r, d, m = cfg.rollout, cost.device, cost.model
    gpu = d.kind == "cuda"
    share = (r.gpu_memory_utilization or VLLM_SHARE) if cost.engine.name == "vllm" else r.gpu_memory_utilization
    budgets = [r.max_batch_tokens] if cost.engine.name == "hf" and r.max_batch_tokens else []
    if gpu and share is not None:
        room = share * d.mem_gb * 1e9 * cost.tp - m.weight_bytes
        if room <= 0:
            raise ValueError(f"a {m.name} model ({m.weight_bytes / 1e9:.0f} GB of weights) does not fit in "
                             f"{share:.0%} of {cost.tp} x {d.name} ({d.mem_gb:g} GB each; "
                             f"rollout.gpu_memory_utilization): raise it, or the rollout tensor parallelism")
        budgets.append(room / m.kv_bytes_per_token)
    return min(budgets) if budgets else None


def elastic_spec(cfg: RLVRConfig) -> ElasticSpec | None:
    e = cfg.simulate.elastic
    return ElasticSpec(e.lent, e.on_s, e.off_s, e.warning_s, seed=cfg.simulate.seed) if e.lent else None


def describe(spec: SimSpec) -> str:
    """What a simulation assumes, in a few lines (printed before a sweep: derived values made visible)."""
    c, w = spec.cost, spec.workload
    whole = w.prompt_tokens + w.max_tokens if spec.agentic is None else spec.agentic.limits.context_tokens
    kv = spec.kv_tokens if spec.kv_tokens is not None else c.kv_capacity_tokens()
    rule = (f"rows reserve prompt + budget: {kv / whole:.0f} of {whole:.0f} tokens fit"
            if c.engine.admission == "reserve" else
            f"paged: {kv / whole:.0f} full-length samples, the newest row preempted when it fills")
    lines = [f"model      {c.model.name}: {c.model.params / 1e9:.2f}B parameters, "
             f"{c.model.kv_bytes_per_token / 1024:.0f} KiB of KV cache per token",
             f"device     {c.device.name}: {c.device.peak_tflops:g} TFLOP/s, {c.device.mem_gbps:g} GB/s, "
             f"{c.device.mem_gb:g} GB; rollout engines of {c.tp} device(s) hold {kv / 1e3:.0f}k tokens of KV cache "
             f"({rule}){f', at most {spec.max_rows} rows' if spec.max_rows else ''}",
             *([_pools_text(spec)] if spec.pools else []),
             f"engine     {_engine_text(c)}: decode {c.decode_step_s(1, w.prompt_tokens) * 1e3:.1f} ms for one row",
             f"weights    {_transport_text(c)}: sync {c.sync_s():.2f} s, engines paused {c.load_s():.2f} s",
             *([f"training   {spec.learner.describe()}"] if spec.learner is not None else []),
             f"workload   prompts ~{w.prompt_tokens:.0f} tokens; responses mean {w.response_tokens:.0f} tokens before "
             f"the {w.max_tokens}-token cap, lognormal sigma {w.length_sigma:.2f}; reward {w.reward_latency_s:g} s"
             if spec.agentic is None else
             f"episodes   ~{w.turns:g} turns of ~{w.turn_tokens:.0f} tokens "
             f"(at most {spec.agentic.limits.turn_tokens}), "
             f"observations ~{w.observation_tokens:.0f} tokens; environment step {w.env_latency_s:g} s "
             f"(cv {w.env_latency_cv:g}) x {spec.agentic.latency_scale:g} on {spec.agentic.slots} environments",
             *([f"replayed   response lengths of {sum(len(g) for g in spec.recorded)} recorded groups over "
                f"{len(spec.recorded)} steps of the calibration run"] if spec.recorded else []),
             f"schedule   {spec.schedule.batch_groups} prompts x {spec.schedule.group_size} samples per step, "
             f"{spec.steps} steps ({spec.warmup} warm-up)"]
    return "\n".join(lines)


def _pools_text(spec: SimSpec) -> str:
    pools = "; ".join(f"{p.devices} x {p.cost.device.name} ({p.engines} engines, "
                      f"{p.cost.decode_step_s(1, spec.workload.prompt_tokens) * 1e3:.1f} ms a row's step, "
                      f"{(p.kv_tokens or p.cost.kv_capacity_tokens()) / 1e3:.0f}k KV tokens each)" for p in spec.pools)
    t = spec.trainer.device
    return (f"pools      rollout on {pools}; training on {spec.layout.train_devices} x {t.name}: "
            f"{spec.price_per_hour:g} an hour in all")


def _engine_text(c: CostModel) -> str:
    e = c.engine
    parts = [f"eager, {c.model.layers * e.layer_launch_s * 1e3:.1f} ms of kernel launches a step"] \
        if e.layer_launch_s else []
    parts += ["KV read at the widest row's length"] if e.padded_kv else []
    scales = {"bandwidth": e.mem_scale, "compute": e.compute_scale, "step overhead": e.overhead_scale}
    parts += [f"{name} x{v:g}" for name, v in scales.items() if v != 1.0]
    return e.name + (f" ({', '.join(parts)})" if parts else "")


def _transport_text(c: CostModel) -> str:
    where = "within a node" if c.same_node else "across nodes"
    return {None: "generic link", "none": "none (hybrid: the policy ranks sample)",
            "gather": "gather (hybrid FSDP2: each rank gathers a full copy)",
            "channel": f"channel (NCCL broadcast {where})" if c.device.kind == "cuda" else "channel (gloo)",
            "object_store": f"object store (through host memory, {where})"}[c.transport]
