"""Which devices each role's workers hold: the checks of the role device lists against the devices that
exist and each other, and the rollout engines' tensor-parallel groups (``rollout.tensor_parallel_size``).

A worker holds one device, except a tensor-parallel rollout engine, which holds ``tp`` consecutive devices
of ``rollout.devices`` (devices 4-7 at tp 2: engines [4, 5] and [6, 7]). Its devices become one
placement bundle (``gyre.cluster.placement``), so Ray puts them on one node.
"""

from __future__ import annotations

from gyre.config.load import ConfigError


def worker_devices(devices: tuple[int, ...], tp: int = 1) -> tuple[tuple[int, ...], ...]:
    """The devices of each worker of a role on ``devices``, ``tp`` consecutive ones each."""
    return tuple(devices[i:i + tp] for i in range(0, len(devices), tp))


def rollout_engines(cfg, roles: dict[str, tuple[int, ...]], device_kind: str, notes: list[str]) -> int:
    """How many rollout engines ``cfg`` (an RLVRConfig) runs, checking its tensor parallelism against the
    backend, the device kind and the other roles' ``roles`` (device lists); ConfigError naming the key."""
    r = cfg.rollout
    tp, devices = r.tensor_parallel_size, r.devices
    engines = len(devices) // tp
    if tp > 1:  # gyre check prints the engines' devices with the rollout role
        _check_tensor_parallel(cfg, roles, device_kind)
    if engines > r.prompts_per_step:
        notes.append(f"{engines} rollout engines for {r.prompts_per_step} prompts: some engines will idle")
    if r.elastic is not None:
        notes.append(_check_elastic(cfg, engines))
    return engines


def _check_elastic(cfg, base: int) -> str:
    """rollout.elastic against the base pool; the note ``gyre check`` prints."""
    r, e = cfg.rollout, cfg.rollout.elastic
    if r.mode == "hybrid":
        raise ConfigError("rollout.elastic lends rollout engines of their own, but rollout.mode=hybrid samples on the "
                          "policy ranks: set rollout.mode=separate, or drop rollout.elastic")
    if e.max_engines < base:
        raise ConfigError(f"rollout.elastic.max_engines={e.max_engines} is below the base pool's {base} engines "
                          f"(rollout.devices): set max_engines >= {base}")
    low = [c for c in e.schedule if c.engines < base]
    if low:
        raise ConfigError(f"rollout.elastic.schedule asks for {low[0].engines} engines at step {low[0].step}, below "
                          f"the base pool's {base} (lent engines come and go; the base pool stays): ask for >= {base}")
    notice = "no notice (samples regenerated)" if e.notice_s is None else f"{e.notice_s:g} s notice"
    sizes = ", ".join(f"step {c.step}: {c.engines}" for c in e.schedule) or "as the controller asks"
    return (f"rollout.elastic: {base} base engine(s) + up to {e.max_engines - base} lent, started outside the run's "
            f"devices (resources {dict(e.resources) or 'a device each'}); pool sizes {sizes}; reclaim with {notice}")


def _check_tensor_parallel(cfg, roles: dict[str, tuple[int, ...]], device_kind: str) -> None:
    r = cfg.rollout
    tp, devices = r.tensor_parallel_size, r.devices
    key = f"rollout.tensor_parallel_size={tp}"
    if r.backend != "vllm" or r.mode == "hybrid":
        what = "rollout.mode=hybrid samples with the policy ranks" if r.mode == "hybrid" else \
            f"rollout.backend={r.backend} runs one engine per device"
        raise ConfigError(f"{key} splits each engine over {tp} GPUs, which only vLLM engines do ({what}): set "
                          "rollout.backend=vllm and rollout.mode=separate, or rollout.tensor_parallel_size=1")
    if device_kind != "cuda":
        raise ConfigError(f"{key} splits each engine over {tp} GPUs, but this run's devices are CPU slots: set "
                          "rollout.tensor_parallel_size=1 (one engine per slot)")
    if len(devices) % tp:
        raise ConfigError(f"{key}: each engine takes {tp} of rollout.devices={list(devices)} ({len(devices)} "
                          f"devices), which must be a multiple of {tp}: add or drop devices, or change "
                          "rollout.tensor_parallel_size")
    for role, others in roles.items():
        shared = sorted(set(others) & set(devices)) if role != "rollout" else []
        if shared:
            raise ConfigError(f"{key}: {role} shares devices {shared} with the rollout, and colocated tensor "
                              "parallelism is not supported (an engine over several GPUs cannot time-share "
                              f"them): give {role} devices apart from rollout.devices (disaggregated), or set "
                              "rollout.tensor_parallel_size=1")


def check_devices_exist(roles: dict[str, tuple[int, ...]], kind: str, num_devices: int) -> None:
    what = "GPU" if kind == "cuda" else "CPU slot"
    for role, devices in roles.items():
        missing = [d for d in devices if d >= num_devices]
        if missing:
            fix = ("set cluster.cpu_slots to create more CPU slots, or " if kind == "cpu" else "")
            raise ConfigError(
                f"impossible placement: {role}.devices={list(devices)} names {what} {missing} but only "
                f"{num_devices} exist (indices 0-{num_devices - 1}); {fix}use devices below {num_devices}")


def shared_devices(roles: dict[str, tuple[int, ...]]) -> dict[tuple[str, str], tuple[int, ...]]:
    """Each pair of roles whose device lists overlap, with the devices they share."""
    names = list(roles)
    shared = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = tuple(sorted(set(roles[a]) & set(roles[b])))
            if common:
                shared[(a, b)] = common
    return shared
