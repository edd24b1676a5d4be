"""Log-probs without the full [tokens, vocab] logits: the model's output layer swapped for a chunked one.

The swap happens inside the model's own forward call, where its output layer would run, so DDP's and
FSDP2's hooks see an ordinary forward (FSDP2's root parameters are gathered at that point) and the
layer receives exactly what the original would have: the final hidden states. Its output is not
logits but, per position, the log-prob of a given next token (and the entropy), [..., 1 or 2].

That is only right when the model returns its output layer's result unchanged; some architectures
soft-cap, scale or slice the logits after it (Gemma 2, Cohere, Granite, ...). ``check_chunkable``
finds out once, at load time, by running the model with a layer that returns a known tensor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from gyre.models.logprobs import chunked_next_token_stats


class ChunkedLogprobHead(torch.nn.Module):
    """Stands in for a causal LM's output layer (nn.Linear) during one forward pass."""

    def __init__(self, layer: torch.nn.Linear, targets: torch.Tensor, temperature: float, chunk_tokens: int,
                 entropy_at: torch.Tensor | None):
        """Per position: the log-prob of ``targets`` and, where ``entropy_at`` is True, the entropy."""
        super().__init__()
        # Not a registered submodule: the swapped-out layer stays where its owner (and FSDP2) keeps it.
        object.__setattr__(self, "layer", layer)
        self.targets, self.temperature, self.chunk_tokens = targets, temperature, chunk_tokens
        self.entropy_at = entropy_at

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.shape[:-1] != self.targets.shape:
            raise RuntimeError(f"the output layer got hidden states {tuple(hidden.shape)} for targets "
                               f"{tuple(self.targets.shape)}: this model does not project every position")
        return chunked_next_token_stats(hidden, self.layer.weight, self.layer.bias, self.targets,
                                        self.temperature, self.chunk_tokens, self.entropy_at)


class _Echo(torch.nn.Module):
    """Returns ``value`` whatever it is given (the probe of ``check_chunkable``)."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.value.to(hidden.device)


@contextlib.contextmanager
def swapped_output_layer(model: torch.nn.Module, replacement: torch.nn.Module) -> Iterator[None]:
    """``replacement`` in place of the output layer of ``model`` (a Hugging Face model, possibly wrapped
    by DDP or peft) for the duration of the block."""
    hf = getattr(model, "module", model)
    layer = hf.get_output_embeddings()
    name = next(n for n, m in hf.named_modules() if m is layer)
    parent_name, _, attr = name.rpartition(".")
    parent = hf.get_submodule(parent_name)
    setattr(parent, attr, replacement)
    try:
        yield
    finally:
        setattr(parent, attr, layer)


def output_layer(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's output layer if it is a plain nn.Linear (what chunking can project with), else None."""
    hf = getattr(model, "module", model)
    layer = hf.get_output_embeddings() if hasattr(hf, "get_output_embeddings") else None
    return layer if type(layer) is torch.nn.Linear else None


@torch.no_grad()
def check_chunkable(model: torch.nn.Module, device: torch.device, key: str) -> None:
    """Raise a ValueError saying what to change when ``model``'s logits cannot be computed in chunks.

    Runs the model once on a few tokens with an output layer that returns a known tensor: a model that
    returns anything else changes its logits after the layer. FSDP2: a collective, call it on every rank."""
    layer = output_layer(model)
    hf = getattr(model, "module", model)
    arch = type(hf).__name__
    if layer is None:
        found = type(hf.get_output_embeddings()).__name__ if hasattr(hf, "get_output_embeddings") else "none"
        raise ValueError(f"{key} needs the model's output layer to be a plain Linear layer, but {arch} has "
                         f"{found} (e.g. a LoRA adapter on lm_head); unset {key} for this model.")
    ids = torch.arange(1, 5, device=device)[None] % layer.out_features
    known = torch.linspace(-300.0, 300.0, 4 * 3).reshape(1, 4, 3)
    with swapped_output_layer(model, _Echo(known)):
        got = hf(input_ids=ids, use_cache=False).logits
    if got.shape != known.shape or not torch.equal(got.float().cpu(), known):
        raise ValueError(f"{arch} changes its logits after the output layer (soft-capping, scaling or slicing), "
                         f"which log-probs computed in chunks would skip: unset {key} for this model.")
