"""What the model code is configured with: LoRA's adapters (``gyre.models.lora``).

A plain frozen record without torch, so the config declares ``policy.lora`` from it
(``gyre.config.base.section_from_spec``) and a policy checkpoint records it (``lora.json``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from gyre.algos.tables import knob


@dataclass(frozen=True)
class LoraSpec:
    """LoRA (peft) on the policy: the base weights stay frozen and only low-rank adapters train, so the
    optimizer state, the checkpoints and every weight sync hold the adapter alone. The rollout engines
    merge each published adapter into their copy of the base weights; the KL reference is the policy's
    own base model with the adapter switched off (no reference role, no second copy of the model)."""

    r: int = knob(16, gt=0)
    """Rank of every adapter: a targeted weight W [out, in] becomes W + scale * B @ A with B [out, r], A [r, in]."""
    alpha: float = knob(32.0, gt=0)
    """The scale's numerator: scale = alpha / r (alpha / sqrt(r) with rslora); peft's lora_alpha."""
    dropout: float = knob(0.0, ge=0, lt=1)
    """Dropout on the adapters' input in training forward passes. Log-prob passes run without it, so a
    non-zero value makes the first optimizer step's ratio differ from 1; 0 (the default) keeps them equal."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """Which layers get an adapter: all-linear (every linear layer of the attention and MLP blocks, not the
    output head), or a list of module names or name suffixes such as [q_proj, v_proj] (peft's
    target_modules). Only linear layers can be targeted: the engines merge adapters into linear weights."""
    modules_to_save: tuple[str, ...] = ()
    """Modules trained in full beside the adapters, e.g. [norm] (peft's modules_to_save: a name or suffix).
    Their whole weights travel with every weight sync. Not the embeddings of a model that ties them to
    the output head."""
    rslora: bool = False
    """Rank-stabilised LoRA: scale = alpha / sqrt(r)."""
    save: Literal["both", "merged", "adapter"] = "both"
    """What the run writes at its end: merged (base + adapter, in model.save_dtype) in final_model/, which
    AutoModelForCausalLM loads; adapter (peft format, PeftModel.from_pretrained) in final_adapter/; or both."""

    @property
    def scale(self) -> float:
        """The factor of B @ A in every targeted weight."""
        return self.alpha / (self.r ** 0.5 if self.rslora else self.r)

    def to_dict(self) -> dict:
        """JSON-ready (lists for the tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict) -> LoraSpec:
        """Back from ``to_dict`` (or a ``lora.json`` an earlier version wrote: the same keys)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})
