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
from gyre.config.schema import RLVRConfig
from gyre.envs.episode import EpisodeLimits
from gyre.rollout.schedule import sampling_params, schedule_spec
from gyre.sim.cost import CostModel
from gyre.sim.elastic import ElasticSpec
from gyre.sim.run import Agentic, Layout, SimSpec
from gyre.sim.workload import WorkloadSpec, fit_lengths, recorded_groups
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
    real run's metrics.jsonl to fit the response lengths from."""
    sim = cfg.simulate
    sampling = sampling_params(cfg)
    model = ModelShape.from_hf_config(cfg.model.path) if sim.model == "config" else model_shape(sim.model)
    placed = layout(cfg, devices or sim.devices)
    device = device_class(sim.device)
    backend, transport = engine_and_transport(cfg, placed, device)
    cost = CostModel(device, model, rollout_tp(cfg), engine_class(backend, device), transport,
                     same_node=placed.devices <= device.node_devices)
    w = sim.workload
    workload = WorkloadSpec(w.prompt_tokens, w.prompt_tokens_cv, w.response_tokens, w.length_sigma, w.prompt_share,
                            sampling.max_new_tokens, w.pass_rate, w.reward_latency_s, w.reward_latency_cv, w.turns,
                            w.turns_cv, w.turn_tokens, w.observation_tokens, w.env_latency_s, w.env_latency_cv,
                            w.reset_latency_s, w.env_failure_rate, w.env_hang_rate)
    recorded = None
    if calibrate is not None:  # a run's metrics.jsonl, or its directory (whole recorded groups replayed)
        run_dir = Path(calibrate) if Path(calibrate).is_dir() else None
        metrics = run_dir / "metrics.jsonl" if run_dir is not None else calibrate
        workload = fit_lengths(metrics, sampling.max_new_tokens, workload)
        groups = recorded_groups(run_dir) if run_dir is not None else None
        recorded = tuple(tuple(step) for step in groups) if groups else None
    agentic = None
    if cfg.env is not None:
        e = cfg.env
        limits = EpisodeLimits(e.max_turns, e.turn_tokens, e.context_tokens, e.observation_tokens, e.window)
        agentic = Agentic(limits, sim.env_slots or e.workers * e.slots_per_worker, sim.env_latency_scale, e.turn_sync,
                          e.max_failures, e.reset_timeout_s, e.step_timeout_s)
        workload = replace(workload, max_tokens=e.turn_tokens)
    schedule = schedule_spec(cfg, sampling)
    max_rows = sim.max_rows or cfg.rollout.max_batch_size
    if schedule.async_ratio > 0 and not schedule.lockstep and max_rows:  # as training does (schedule_spec)
        schedule = replace(schedule, engine_slots=max_rows)
    return SimSpec(schedule, placed, cost, workload,
                   steps=sim.steps, warmup=min(sim.warmup_steps, sim.steps - 1), partial=cfg.rollout.partial,
                   max_rows=max_rows, reward_workers=sim.reward_workers,
                   passes=step_passes(cfg).forward_equivalents(), agentic=agentic, seed=sim.seed,
                   padding=cfg.policy.remove_padding, micro_batch=cfg.policy.micro_batch_size,
                   elastic=elastic_spec(cfg), recorded=recorded)


def elastic_spec(cfg: RLVRConfig) -> ElasticSpec | None:
    e = cfg.simulate.elastic
    return ElasticSpec(e.lent, e.on_s, e.off_s, e.warning_s, seed=cfg.simulate.seed) if e.lent else None


def describe(spec: SimSpec) -> str:
    """What a simulation assumes, in a few lines (printed before a sweep: derived values made visible)."""
    c, w = spec.cost, spec.workload
    whole = w.prompt_tokens + w.max_tokens if spec.agentic is None else spec.agentic.limits.context_tokens
    rows = c.kv_capacity_tokens() / whole
    lines = [f"model      {c.model.name}: {c.model.params / 1e9:.2f}B parameters, "
             f"{c.model.kv_bytes_per_token / 1024:.0f} KiB of KV cache per token",
             f"device     {c.device.name}: {c.device.peak_tflops:g} TFLOP/s, {c.device.mem_gbps:g} GB/s, "
             f"{c.device.mem_gb:g} GB; rollout engines of {c.tp} device(s) hold {rows:.0f} full-length samples "
             f"(KV cache){f', at most {spec.max_rows} rows' if spec.max_rows else ''}",
             f"engine     {_engine_text(c)}: decode {c.decode_step_s(1, w.prompt_tokens) * 1e3:.1f} ms for one row",
             f"weights    {_transport_text(c)}: sync {c.sync_s():.2f} s, engines paused {c.load_s():.2f} s",
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
