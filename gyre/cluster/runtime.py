"""Start gyre's own local Ray, or join a named cluster, and count its devices.

Without an address gyre always starts a private Ray (``address="local"``): it never joins whatever a
``ray start``, a stale address file in /tmp/ray or $RAY_ADDRESS points at. Joining a named cluster is
checked first (a TCP connection to its port) and bounded by ``cluster.connect_timeout_s``, because Ray
itself retries an unreachable or foreign address for ever.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from gyre.config.derive import DeviceKind
from gyre.config.load import ConfigError
from gyre.config.schema import RLVRConfig

_PROBE_TIMEOUT_S = 5.0


class ClusterError(RuntimeError):
    """The Ray cluster named by --address or cluster.address cannot be reached or joined."""


@dataclass
class RayRuntime:
    address: str | None
    """None for the private local instance; else the address joined."""
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


def resolve_address(cfg: RLVRConfig, cli_address: str | None = None, echo=print) -> str | None:
    """The cluster to join (--address, else cluster.address), or None for a private local Ray."""
    address = cli_address or cfg.cluster.address or None
    if address == "local":
        return None
    if not address and os.environ.get("RAY_ADDRESS"):
        echo(f"note: ignoring RAY_ADDRESS={os.environ['RAY_ADDRESS']}: gyre starts its own local Ray; to join that "
             "cluster, pass --address $RAY_ADDRESS")
    return address


def check_reachable(address: str, source: str = "--address") -> None:
    """Fail in seconds, with the fix, when nothing accepts connections at ``address``."""
    host, port = _host_port(address, source)
    try:
        socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        why = f"no answer in {_PROBE_TIMEOUT_S:g} s" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ClusterError(_cannot_reach(address, source, f"connecting to {host}:{port} failed ({why})")) from None


def _host_port(address: str, source: str) -> tuple[str, int]:
    if address == "auto":
        from ray._private.services import get_ray_address_from_environment

        try:
            address = get_ray_address_from_environment("auto", None)
        except ConnectionError:
            why = "no running Ray cluster was found on this machine"
            raise ClusterError(_cannot_reach("auto", source, why)) from None
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"{source} {address!r} is not an address: use host:port (a `ray start --head` "
                           "cluster), ray://host:port (Ray client) or auto; or drop it to run on a private local Ray.")
    return host.strip("[]"), int(port)


def _cannot_reach(address: str, source: str, why: str) -> str:
    return (f"cannot reach a Ray cluster at {address} ({source}): {why}. Start one with `ray start --head` and pass "
            f"the address it prints, check the host and port, or drop {source} to run on a private local Ray.")


def start_ray(cfg: RLVRConfig, device_kind: DeviceKind, num_devices: int, address: str | None,
              reward_workers: int = 1) -> RayRuntime:
    """Join ``address`` (devices counted from the cluster), or start a private local Ray sized for the plan."""
    import ray

    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}}
    if ray.is_initialized():  # e.g. a test session or notebook that started Ray already
        return _describe_existing(cfg, owned=False)
    if address:
        _join(address, env, cfg.cluster.connect_timeout_s)
        return _describe_existing(cfg, owned=True, address=address)
    lent = _lent_engines(cfg)
    if device_kind == "cuda":
        resources = {"num_gpus": num_devices + lent * cfg.rollout.tensor_parallel_size,
                     "num_cpus": max(os.cpu_count() or 1, num_devices + 1 + reward_workers + lent)}
    else:
        # One logical CPU per device slot, plus one per reward worker (outside the slots) and lent engine.
        resources = {"num_cpus": num_devices + reward_workers + lent}
    if lent and cfg.rollout.elastic.resources:  # the custom resources lent engines ask for, enough for each
        resources["resources"] = {k: v * lent for k, v in cfg.rollout.elastic.resources.items()}
    with _private_start():
        ray.init(address="local", include_dashboard=False, runtime_env=env, **resources)
    return RayRuntime(None, device_kind, num_devices, owned=True)


def _lent_engines(cfg) -> int:
    """Most lent rollout engines a run may hold at once (rollout.elastic), for a private Ray to declare."""
    r = getattr(cfg, "rollout", None)
    if r is None or r.elastic is None:
        return 0
    return max(0, r.elastic.max_engines - len(r.devices) // r.tensor_parallel_size)


@contextmanager
def _private_start():
    """Around a local ``ray.init``: its processes must not inherit $RAY_ADDRESS, and the SIGTERM handler
    it installs (sys.exit) must not replace the caller's (gyre's clean stop)."""
    saved = os.environ.pop("RAY_ADDRESS", None)
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved
        if main and handler is not None:
            signal.signal(signal.SIGTERM, handler)


def _join(address: str, env: dict, timeout_s: float) -> None:
    """``ray.init(address)`` with a deadline: it runs in a daemon thread, abandoned if the cluster does not
    answer in time (Ray would retry for ever). Off the main thread, Ray leaves SIGTERM alone."""
    import ray

    outcome: dict[str, BaseException | None] = {}

    def connect() -> None:
        try:
            ray.init(address=address, runtime_env=env, log_to_driver=True)
            outcome["error"] = None
        except Exception as exc:  # noqa: BLE001 - reported to the caller below
            outcome["error"] = exc

    worker_log = logging.getLogger("ray._private.worker")
    quiet = _DropThreadWarning()
    worker_log.addFilter(quiet)
    thread = threading.Thread(target=connect, name="gyre-ray-join", daemon=True)
    thread.start()
    thread.join(timeout_s)
    worker_log.removeFilter(quiet)
    if thread.is_alive():
        raise ClusterError(_cannot_reach(address, "--address", f"something accepts connections there but no Ray "
                                         f"cluster answered within cluster.connect_timeout_s={timeout_s:g} s"))
    error = outcome.get("error")
    if error is not None:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ClusterError(_cannot_reach(address, "--address", f"{type(error).__name__}: {first[:300]}"))


class _DropThreadWarning(logging.Filter):
    """Ray warns that it sets no SIGTERM handler off the main thread: exactly what gyre wants."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


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
