"""Pack model weights into a few flat byte buckets for transfer through the Ray object store.

One contiguous numpy buffer per bucket travels zero-copy through Ray's shared memory (pickling many
small torch tensors is several times slower), works for any dtype including bfloat16 (moved as raw
bytes), and bounds peak memory per bucket. A checksum per bucket catches a silently broken transfer.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

_DEFAULT_BUCKET_BYTES = 256 << 20


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass
class WeightBundle:
    """Weights of one policy version: tensor metadata plus the raw bucket bytes."""

    version: int
    metas: list[TensorMeta]
    buckets: list[np.ndarray]
    checksums: list[int]
    lora: dict | None = None
    """None: the tensors are the model's weights. Otherwise a LoRA policy's adapters (``gyre.models.lora``):
    targeted layer -> ``LoraTarget``, with the factors as ``<layer>.lora_A`` / ``<layer>.lora_B`` and any
    other tensor a parameter trained in full that replaces the engine's own."""

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)


def pack_weights(state: Mapping[str, torch.Tensor], version: int, bucket_bytes: int = _DEFAULT_BUCKET_BYTES,
                 lora: dict | None = None) -> WeightBundle:
    """Flatten ``state`` (name -> tensor, any device/dtype) into byte buckets of about ``bucket_bytes``;
    ``lora`` says the tensors are adapters (``WeightBundle.lora``)."""
    metas: list[TensorMeta] = []
    groups: list[list[tuple[str, torch.Tensor]]] = [[]]
    size = 0
    for name, tensor in state.items():
        t = tensor.detach().to("cpu").contiguous()
        nbytes = t.numel() * t.element_size()
        if groups[-1] and size + nbytes > bucket_bytes:
            groups.append([])
            size = 0
        dtype = str(t.dtype).removeprefix("torch.")
        metas.append(TensorMeta(name, dtype, tuple(t.shape), len(groups) - 1, size, nbytes))
        groups[-1].append((name, t))
        size += nbytes
    buckets = []
    for group in groups:
        total = sum(t.numel() * t.element_size() for _, t in group)
        buf = np.empty(total, dtype=np.uint8)
        offset = 0
        for _, t in group:
            n = t.numel() * t.element_size()
            buf[offset:offset + n] = t.view(-1).view(torch.uint8).numpy()
            offset += n
        buckets.append(buf)
    return WeightBundle(version, metas, buckets, [zlib.adler32(b) for b in buckets], lora)


def unpack_weights(bundle: WeightBundle, verify: bool = True) -> dict[str, torch.Tensor]:
    """Tensors viewing the bundle's buffers (no copy); verifies the checksums first."""
    if verify:
        for i, (buf, expected) in enumerate(zip(bundle.buckets, bundle.checksums)):
            if zlib.adler32(buf) != expected:
                raise RuntimeError(f"weight bucket {i} of version {bundle.version} is corrupt (checksum mismatch)")
    out = {}
    with warnings.catch_warnings():
        # Buffers from the object store are read-only; the tensors are only ever copied from.
        warnings.simplefilter("ignore", UserWarning)
        for m in bundle.metas:
            raw = torch.from_numpy(bundle.buckets[m.bucket][m.offset:m.offset + m.nbytes])
            out[m.name] = raw.view(getattr(torch, m.dtype)).view(m.shape)
    return out
