"""LoRA on the policy (peft): adapters on the trainer, merged weights on the rollout engines.

The trainer wraps its model with peft, so only the adapters train (``apply_lora``). What leaves the
trainer is adapter-only: every weight sync sends each targeted layer's factors A [r, in] and B [out, r]
with its scale (``AdapterWeights``), and every engine writes base + scale * B @ A into its own weights
(``AdapterMerger``, which keeps the base weights in host memory). The same arithmetic merges the final
model (``merged_state_dict``), so an engine holds exactly what ``merge_and_unload`` would give.

Names: peft injects its layers into the model in place, so a targeted layer keeps its name in the
model (``model.layers.0.self_attn.q_proj``), its frozen weight moves to ``<layer>.base_layer.weight``
and its factors are ``<layer>.lora_A.default.weight`` / ``lora_B``. A module trained in full
(``modules_to_save``) is ``<module>.modules_to_save.default.<param>`` beside the untouched
``<module>.original_module.<param>``. ``AdapterWeights`` speaks the base model's names.

peft is imported inside the functions that need it: ``import gyre`` and runs without LoRA do not.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from gyre.models.specs import LoraSpec

ADAPTER = "default"
"""peft's name of the one adapter gyre trains."""
MARKER = "lora.json"
"""In a policy checkpoint directory: the LoRA config it was trained with (its weights are adapter-only)."""
_A, _B = f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight"
_SAVED, _ORIGINAL, _BASE = f".modules_to_save.{ADAPTER}.", ".original_module.", ".base_layer."


@dataclass(frozen=True)
class LoraTarget:
    """How one targeted linear layer merges: W + scale * B @ A (transposed for ``fan_in_fan_out`` layers,
    such as GPT-2's Conv1D, which store W as [in, out])."""

    scale: float
    fan_in_fan_out: bool = False


@dataclass
class AdapterWeights:
    """One version of a LoRA policy as the rollout engines need it, in the base model's names."""

    factors: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """Targeted layer -> (A [r, in], B [out, r])."""
    targets: dict[str, LoraTarget]
    """Targeted layer -> its scale and layout."""
    full: dict[str, torch.Tensor] = field(default_factory=dict)
    """Parameters trained in full (modules_to_save) under their base names; they replace the base's."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """Flat name -> tensor, for a ``WeightBundle`` (``<layer>.lora_A``, ``<layer>.lora_B``, full ones)."""
        out = {}
        for layer, (a, b) in self.factors.items():
            out[f"{layer}.lora_A"], out[f"{layer}.lora_B"] = a, b
        return {**out, **self.full}

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], targets: dict[str, LoraTarget]) -> AdapterWeights:
        """Undo ``tensors``."""
        factors = {layer: (tensors[f"{layer}.lora_A"], tensors[f"{layer}.lora_B"]) for layer in targets}
        taken = {f"{layer}.lora_{x}" for layer in targets for x in "AB"}
        return cls(factors, dict(targets), {k: v for k, v in tensors.items() if k not in taken})

    @classmethod
    def from_trainable_state(cls, state: Mapping[str, torch.Tensor], targets: dict[str, LoraTarget]) -> AdapterWeights:
        """From the trainer's trainable parameters (peft's names in the injected model)."""
        factors = {layer: (state[layer + _A], state[layer + _B]) for layer in targets}
        full = {name.replace(_SAVED, "."): t for name, t in state.items() if _SAVED in name}
        return cls(factors, dict(targets), full)


def peft_config(cfg: LoraSpec):
    """peft's LoraConfig for gyre's ``policy.lora`` section."""
    import peft

    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    return peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets,
                           modules_to_save=list(cfg.modules_to_save) or None, use_rslora=cfg.rslora,
                           bias="none", task_type="CAUSAL_LM")


def apply_lora(model: torch.nn.Module, cfg: LoraSpec, gradient_checkpointing: bool = False, seed: int = 0):
    """Inject adapters into ``model`` in place (its other parameters are frozen); returns peft's wrapper,
    whose ``disable_adapter()`` gives the base model back. The adapters' random init (A; B starts at 0)
    comes from ``seed`` alone: every rank starts from the same adapters (FSDP2 does not broadcast them),
    whatever the rank count. Raises ``LoraTargetError`` when the config targets nothing, a layer that is
    not linear, or an embedding tied to the output head."""
    import peft

    tied = _tied_embeddings(model)  # before peft wraps them
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore", FutureWarning)  # peft reads attributes transformers has deprecated
        torch.manual_seed(seed)
        try:
            wrapped = peft.get_peft_model(model, peft_config(cfg), adapter_name=ADAPTER)
        except ValueError as exc:
            raise LoraTargetError(_no_target_message(model, cfg, exc)) from None
    _check_targets(model, cfg, tied)
    if gradient_checkpointing:
        # With frozen embeddings the checkpointed blocks' inputs would not require grad, and re-entrant
        # checkpointing would then drop the adapters' gradients.
        model.enable_input_require_grads()
    return wrapped


class LoraTargetError(ValueError):
    """policy.lora names modules gyre cannot train as adapters in this model; the message says what to change."""


def _linear_names(model: torch.nn.Module) -> list[str]:
    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def _no_target_message(model: torch.nn.Module, cfg: LoraSpec, exc: ValueError) -> str:
    return (f"policy.lora.target_modules={cfg.target_modules!r} / modules_to_save={cfg.modules_to_save!r} "
            f"cannot be applied to this model ({str(exc).splitlines()[0][:200]}). Its linear layers are named "
            f"{', '.join(_linear_names(model))}: list some of those, or use all-linear.")


def _tied_embeddings(model: torch.nn.Module) -> dict[int, str]:
    """id -> what it is tied to, for the input and output embeddings of a model that ties them."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return {}
    return {id(model.get_input_embeddings()): "output head", id(model.get_output_embeddings()): "input embeddings"}


def _check_targets(model: torch.nn.Module, cfg: LoraSpec, tied: dict[int, str]) -> None:
    from peft.tuners.lora import LoraLayer
    from transformers.pytorch_utils import Conv1D

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and not isinstance(module.get_base_layer(), (torch.nn.Linear, Conv1D)):
            raise LoraTargetError(
                f"policy.lora.target_modules={cfg.target_modules!r} reaches {name}, a "
                f"{type(module.get_base_layer()).__name__}: gyre merges adapters into linear layers only. Name "
                f"linear layers ({', '.join(_linear_names(model))}) or use all-linear.")
        base = module.get_base_layer() if isinstance(module, LoraLayer) else getattr(module, "original_module", None)
        if base is not None and id(base) in tied:
            raise LoraTargetError(
                f"policy.lora adapts or trains {name}, which this model ties to its {tied[id(base)]}: the two "
                "would part in training while the rollout engines hold one tensor. Leave it out of "
                "policy.lora.target_modules and policy.lora.modules_to_save.")


@dataclass(frozen=True)
class LoraSize:
    """What a LoRA run trains, counted on the model's architecture (``gyre check`` prints it)."""

    layers: int
    """Linear layers that get an adapter."""
    trainable: int
    """Parameters that train: the adapters and any modules_to_save."""
    total: int
    """Parameters of the model with its adapters."""


def lora_size(model_path: str, cfg: LoraSpec, trust_remote_code: bool = False) -> LoraSize:
    """Inject the adapters into the model of ``model_path`` built on the meta device (no weight is read or
    allocated) and count. Raises ``LoraTargetError`` as a run would, before any worker starts."""
    return _lora_size(str(model_path), json.dumps(cfg.to_dict()), trust_remote_code)


@functools.lru_cache(maxsize=8)
def _lora_size(model_path: str, cfg_json: str, trust_remote_code: bool) -> LoraSize:
    from transformers import AutoConfig, AutoModelForCausalLM

    from gyre.models.loading import quiet_transformers

    quiet_transformers()
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    apply_lora(model, LoraSpec.from_dict(json.loads(cfg_json)))
    params = list(model.parameters())
    return LoraSize(len(lora_targets(model)), sum(p.numel() for p in params if p.requires_grad),
                    sum(p.numel() for p in params))


def lora_targets(model: torch.nn.Module) -> dict[str, LoraTarget]:
    """Every adapted layer of the injected ``model`` (by its name there) with its scale and layout."""
    from peft.tuners.lora import LoraLayer

    return {name: LoraTarget(float(m.scaling[ADAPTER]), bool(getattr(m, "fan_in_fan_out", False)))
            for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_weight(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, target: LoraTarget) -> torch.Tensor:
    """base + scale * B @ A in float32: peft's merge (``merge_and_unload``), operation for operation."""
    delta = b.float() @ a.float()
    if target.fan_in_fan_out:
        delta = delta.T
    return base.float() + delta * target.scale


def merged_state_dict(state: Mapping[str, torch.Tensor], targets: dict[str, LoraTarget]) -> dict[str, torch.Tensor]:
    """The whole state of the injected model (peft's names) as the plain model's: each targeted layer's
    weight merged, the factors and the untrained copies of modules_to_save dropped."""
    out = {}
    for name, tensor in state.items():
        if ".lora_A." in name or ".lora_B." in name or _ORIGINAL in name:
            continue
        if _BASE in name:
            layer = name.split(_BASE)[0]
            name = name.replace(_BASE, ".")
            if name == f"{layer}.weight" and layer in targets:
                tensor = merged_weight(tensor, state[layer + _A], state[layer + _B], targets[layer])
        out[name.replace(_SAVED, ".")] = tensor
    return out


class AdapterMerger:
    """The rollout engine's side of a LoRA weight sync. It keeps the base weight of every targeted layer in
    host memory (taken at the first adapter it merges, when the engine still holds the weights it loaded)
    and writes base + scale * B @ A into the engine's own weight on each publication: merging from the base
    each time, never on top of the last merge, so no rounding accumulates over versions."""

    def __init__(self) -> None:
        self._base: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def merge(self, model: torch.nn.Module, adapter: AdapterWeights) -> None:
        params = model.state_dict(keep_vars=True)  # persistent tensors, sharing storage with the model
        wanted = [f"{layer}.weight" for layer in adapter.factors] + list(adapter.full)
        missing = [name for name in wanted if name not in params]
        if missing:
            raise KeyError(f"the adapter names {len(missing)} weights this engine's model lacks, e.g. {missing[:3]}")
        for layer, (a, b) in adapter.factors.items():
            target = params[f"{layer}.weight"]
            base = self._base.get(layer)
            if base is None:
                base = self._base[layer] = target.detach().to("cpu", copy=True)
            device = target.device
            target.copy_(merged_weight(base.to(device), a.to(device), b.to(device), adapter.targets[layer]))
        for name, tensor in adapter.full.items():
            params[name].copy_(tensor.to(dtype=params[name].dtype, device=params[name].device))


# ---- checkpoints and saved models -------------------------------------------------------------------
def write_marker(directory: str | Path, cfg: LoraSpec) -> None:
    """Say in a policy checkpoint that its weights are an adapter, and which (``export_lora`` reads it)."""
    (Path(directory) / MARKER).write_text(json.dumps(cfg.to_dict(), indent=1) + "\n")


def read_marker(directory: str | Path) -> LoraSpec | None:
    """The LoRA config a policy checkpoint was trained with; None for a full-weight checkpoint."""
    path = Path(directory) / MARKER
    return LoraSpec.from_dict(json.loads(path.read_text())) if path.is_file() else None


def resume_problem(directory: str | Path, now: LoraSpec | None) -> str | None:
    """Why the policy checkpoint in ``directory`` cannot continue a run configured with ``now`` (its
    policy.lora), or None: adapters and full weights do not mix, and adapters need their own shape."""
    saved = read_marker(directory)
    if (saved is None) != (now is None):
        what = "LoRA adapters only (policy.lora was set)" if saved else "every weight (policy.lora was not set)"
        fix = "set policy.lora as it was" if saved else "remove policy.lora"
        return f"its policy checkpoint holds {what}; {fix}, or start a fresh run"
    shape = {"save"}  # what the run writes at its end may change; the adapters may not
    kept = lambda spec: {k: v for k, v in spec.to_dict().items() if k not in shape}  # noqa: E731
    if saved is not None and kept(saved) != kept(now):
        return (f"it trained LoRA adapters {kept(saved)}, the config now asks for {kept(now)}; set policy.lora "
                "as it was, or start a fresh run")
    return None


def save_adapter(peft_model, trainable: Mapping[str, torch.Tensor], directory: str | Path,
                 tokenizer_source: str | Path | None = None) -> None:
    """Write the adapter in peft's format (PeftModel.from_pretrained(base, directory) loads it) from the
    trainable parameters ``trainable`` (names of the injected model, full tensors), with the tokenizer
    files of ``tokenizer_source`` beside it."""
    from gyre.models.saving import copy_tokenizer_files

    prefix = "base_model.model."  # where peft's wrapper keeps the injected model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "could not find a config file": the base is a local dir
        peft_model.save_pretrained(str(directory), state_dict={prefix + k: v for k, v in trainable.items()})
    if tokenizer_source is not None:
        copy_tokenizer_files(tokenizer_source, directory)


def export_lora(checkpoint: str | Path, model_path: str | Path, out: str | Path, *, merge: bool = True,
                dtype: str | None = None, tokenizer_path: str | Path | None = None,
                trust_remote_code: bool = False, overwrite: bool = False) -> Path:
    """Turn a LoRA policy checkpoint into a Hugging Face directory at ``out``; returns ``out``.

    ``checkpoint``: a checkpoint step directory (``<run>/checkpoints/step_000040``) or its ``policy/``.
    ``model_path``: the local base model directory the run trained from (its resolved ``model.path``).
    ``merge`` True writes the base with the adapters merged in ``dtype`` (None: the base's stored dtype),
    which ``AutoModelForCausalLM.from_pretrained(out)`` loads; False writes the adapter in peft's format,
    which ``PeftModel.from_pretrained(base, out)`` loads (its config names ``model_path`` as the base).
    The tokenizer files of ``tokenizer_path`` (default ``model_path``) are copied unchanged. Runs on the
    CPU in this process, no Ray. ``out`` must be new or empty unless ``overwrite`` (files of the same
    names are then replaced, nothing else is removed). Raises ``ValueError`` with what to change.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from gyre.models.loading import load_causal_lm
    from gyre.models.saving import save_hf_model, stored_dtype

    policy = Path(checkpoint) / "policy" if (Path(checkpoint) / "policy").is_dir() else Path(checkpoint)
    cfg = read_marker(policy)
    if cfg is None:
        raise ValueError(f"{checkpoint} is not a LoRA policy checkpoint (no {MARKER} in {policy}): export it as a "
                         "full model instead")
    target = Path(out)
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise ValueError(f"{target} exists and is not empty: choose a new directory, or allow overwriting")
    target.mkdir(parents=True, exist_ok=True)
    model = load_causal_lm(model_path, "float32", trust_remote_code, "cpu")
    wrapped = apply_lora(model, cfg)
    trainable = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
    # In place (the tensors are the parameters), in this process alone when no process group runs.
    single = not (dist.is_available() and dist.is_initialized())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to load in a single process": it is
        dcp.load({"model": trainable}, storage_reader=dcp.FileSystemReader(str(policy)), no_dist=single)
    tokenizer = tokenizer_path or model_path
    if not merge:
        save_adapter(wrapped, trainable, target, tokenizer)
        return target
    state = merged_state_dict({k: v.detach() for k, v in model.state_dict().items()}, lora_targets(model))
    save_hf_model(model, state, target, dtype or stored_dtype(model_path) or "float32", tokenizer)
    return target
