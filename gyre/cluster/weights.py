"""Pack model weights into a few flat byte buckets: for the Ray object store (``pack_weights``: host
buffers) and for a weight channel (``stage_buckets``: buffers on the sender's device, broadcast to the
engines by ``gyre.cluster.channel``).

One contiguous buffer per bucket travels as one message (zero-copy through Ray's shared memory; one
broadcast on a channel: pickling or sending many small tensors is several times slower), works for any
dtype including bfloat16 (moved as raw bytes), and bounds peak memory per bucket. A checksum per bucket
catches a silently broken transfer.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

_DEFAULT_BUCKET_BYTES = 256 << 20
_ALIGN = 8
"""Bucket sizes and tensor offsets are multiples of this, so every dtype's view of a bucket is aligned and
the checksum can read a bucket as 32-bit words."""


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class WeightManifest:
    """What a weight channel's receivers need before the bytes arrive: every tensor's place in the buckets."""

    version: int
    metas: list[TensorMeta]
    sizes: list[int]
    """Each bucket's length in bytes."""
    checksums: list[int]
    """Each bucket's ``bucket_checksum`` as the sender staged it."""
    lora: dict | None = None
    """As ``WeightBundle.lora``."""

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)


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


def stage_buckets(tensors: Iterable[tuple[str, torch.Tensor]], device: torch.device | str = "cpu",
                  bucket_bytes: int = _DEFAULT_BUCKET_BYTES, solo_bytes: int | None = None,
                  ) -> tuple[list[torch.Tensor], list[TensorMeta]]:
    """Copy ``tensors`` (name, tensor: any device and dtype, taken one at a time, so an iterator that
    gathers each as it is reached holds at most one bucket's worth) into uint8 buckets of about
    ``bucket_bytes`` on ``device``; returns the buckets and every tensor's place in them. A tensor of
    ``solo_bytes`` or more gets a bucket of its own, exactly its size (a receiver may take it straight
    into the tensor it replaces)."""
    buckets: list[torch.Tensor] = []
    metas: list[TensorMeta] = []
    pending: list[tuple[TensorMeta, torch.Tensor]] = []
    size = 0

    def flush() -> None:
        nonlocal size
        bucket = torch.empty(size, dtype=torch.uint8, device=device)
        for meta, t in pending:
            bucket[meta.offset:meta.offset + meta.nbytes].copy_(t.reshape(-1).view(torch.uint8))
        buckets.append(bucket)
        pending.clear()
        size = 0

    for name, tensor in tensors:
        t = tensor.detach().contiguous()
        nbytes = t.numel() * t.element_size()
        solo = solo_bytes is not None and nbytes >= solo_bytes
        if pending and (solo or size + nbytes > bucket_bytes):
            flush()
        if solo:
            metas.append(TensorMeta(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), len(buckets), 0, nbytes))
            buckets.append(t.reshape(-1).view(torch.uint8).to(device, copy=True))
            continue
        metas.append(TensorMeta(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), len(buckets), size, nbytes))
        pending.append((metas[-1], t))
        size += -(-nbytes // _ALIGN) * _ALIGN
    if pending or not buckets:
        flush()
    return buckets, metas


def bucket_views(buckets: list[torch.Tensor], metas: list[TensorMeta]) -> dict[str, torch.Tensor]:
    """Each tensor as a view into its bucket (no copy)."""
    return {m.name: buckets[m.bucket][m.offset:m.offset + m.nbytes].view(getattr(torch, m.dtype)).view(m.shape)
            for m in metas}


def bucket_checksum(bucket: torch.Tensor) -> int:
    """A uint8 bucket's checksum where it lives: adler32 of a host bucket (zlib, no copy), ``block_checksum``
    of a device bucket (no copy to the host). Sender and receivers of one channel hold their buckets on
    the same kind of device, so they compute the same function."""
    if bucket.device.type == "cpu":
        return zlib.adler32(bucket.numpy())
    return block_checksum(bucket)


def block_checksum(bucket: torch.Tensor) -> int:
    """An order-sensitive checksum of a uint8 bucket computed on its device (one host sync): the sum of its
    32-bit words in 1024-word blocks, each block weighted by its position (a bit flipped, a block swapped
    or a truncated transfer changes it), wrapping in int64."""
    whole = bucket.numel() // 4 * 4
    words = bucket[:whole].view(torch.int32)
    total = bucket[whole:].sum(dtype=torch.int64)  # a tail of 1-3 bytes (a solo bucket of 2-byte values)
    chunk = 1 << 22  # words summed per pass: bounds the int64 copy a reduction makes
    for start in range(0, words.numel(), chunk):
        part = words[start:start + chunk]
        full = part.numel() // 1024 * 1024
        blocks = part[:full].view(-1, 1024).sum(dim=1, dtype=torch.int64)
        if full < part.numel():
            blocks = torch.cat([blocks, part[full:].sum(dtype=torch.int64).view(1)])
        index = torch.arange(start // 1024 + 1, start // 1024 + 1 + blocks.numel(), device=bucket.device)
        total += (blocks * index).sum()
    return int(total)


def pack_weights(state: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], version: int,
                 bucket_bytes: int = _DEFAULT_BUCKET_BYTES, lora: dict | None = None) -> WeightBundle:
    """Flatten ``state`` (name -> tensor, or name, tensor pairs; any device and dtype) into host byte buckets
    of about ``bucket_bytes``; ``lora`` says the tensors are adapters (``WeightBundle.lora``)."""
    buckets, metas = stage_buckets(state.items() if isinstance(state, Mapping) else state, "cpu", bucket_bytes)
    return WeightBundle(version, metas, [b.numpy() for b in buckets], [bucket_checksum(b) for b in buckets], lora)


def unpack_weights(bundle: WeightBundle, verify: bool = True) -> dict[str, torch.Tensor]:
    """Tensors viewing the bundle's buffers (no copy); verifies the checksums first."""
    if verify:
        for i, (buf, expected) in enumerate(zip(bundle.buckets, bundle.checksums)):
            if zlib.adler32(buf) != expected:
                raise RuntimeError(f"weight bucket {i} of version {bundle.version} is corrupt (checksum mismatch)")
    with warnings.catch_warnings():
        # Buffers from the object store are read-only; the tensors are only ever copied from.
        warnings.simplefilter("ignore", UserWarning)
        return bucket_views([torch.from_numpy(b) for b in bundle.buckets], bundle.metas)
