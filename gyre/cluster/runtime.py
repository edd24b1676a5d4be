"""Start an embedded local Ray, or join an existing cluster, and count its devices."""

from __future__ import annotations

import os
from dataclasses import dataclass

from gyre.config.derive import DeviceKind
from gyre.config.load import ConfigError
from gyre.config.schema import RLVRConfig


@dataclass
class RayRuntime:
    address: str | None
    """None for the embedded local instance; else the address joined."""
    device_kind: DeviceKind
    num_devices: int
    owned: bool
    """True when this run connected (started a local Ray or joined a cluster) and must disconnect; False
    when Ray was already initialised by the caller (a notebook, a test session)."""

    def shutdown(self) -> None:
        """Disconnect if this run connected; a joined cluster keeps running."""
        import ray

        if self.owned and ray.is_initialized():
            ray.shutdown()


def resolve_address(cfg: RLVRConfig, cli_address: str | None = None) -> str | None:
    return cli_address or cfg.cluster.address or os.environ.get("RAY_ADDRESS") or None


def start_ray(cfg: RLVRConfig, device_kind: DeviceKind, num_devices: int, address: str | None,
              reward_workers: int = 1) -> RayRuntime:
    """Join ``address`` (devices counted from the cluster), or start a local Ray sized for the plan."""
    import ray

    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}}
    if ray.is_initialized():  # e.g. a test session or notebook that started Ray already
        return _describe_existing(cfg, owned=False)
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return _describe_existing(cfg, owned=True, address=address)
    if device_kind == "cuda":
        ray.init(num_gpus=num_devices, num_cpus=max(os.cpu_count() or 1, num_devices + 1 + reward_workers),
                 include_dashboard=False, runtime_env=env)
    else:
        # One logical CPU per device slot, plus one per reward worker (outside the slots).
        ray.init(num_cpus=num_devices + reward_workers, include_dashboard=False, runtime_env=env)
    return RayRuntime(None, device_kind, num_devices, owned=True)


def _describe_existing(cfg: RLVRConfig, owned: bool, address: str | None = None) -> RayRuntime:
    import ray

    resources = ray.cluster_resources()
    gpus = int(resources.get("GPU", 0))
    if cfg.cluster.device == "cuda" and gpus == 0:
        raise ConfigError(f"cluster.device is cuda but the Ray cluster at {address} has no GPUs")
    if gpus and cfg.cluster.device != "cpu":
        return RayRuntime(address, "cuda", gpus, owned)
    cpus = int(resources.get("CPU", 0))
    # One CPU stays free for the reward worker, which holds no device.
    slots = cfg.cluster.cpu_slots or max(1, cpus - 1)
    return RayRuntime(address, "cpu", slots, owned)
