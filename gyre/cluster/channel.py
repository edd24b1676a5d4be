"""Weight channels: the policy's rank 0 broadcasts new weights to the rollout engines over a process group
of their own (NCCL between GPUs, gloo on CPU), instead of through host memory and Ray's object store.

The object-store path (``gyre.cluster.weights.pack_weights``) copies every byte to the sender's host
memory, into the store, out of it on each engine's host and then to the engine's device. Here the sender
stages one publication as byte buckets on its own device, already in the engines' dtype (``Sender.stage``);
when the driver loads that version, the sender and every engine join the channel's group and the buckets
are broadcast, in order, each straight into a buffer on each engine's device (a large tensor travels
alone, straight into the engine's own weight), while the engine checks the ones already in. First travel
the headers (each bucket's version, index, length and checksum): an engine refuses a bucket of another
version, of the wrong length or whose checksum differs from the manifest's, so a mismatched sender and
receiver fail loudly instead of loading a silently wrong model.

The group of one *generation* is built once, from a TCP store the sender hosts (rank 0 is the sender,
rank r + 1 engine r), and reused by every publication. Every wait polls an abort flag and a deadline: a
member lost mid-broadcast does not hold the others. The driver then aborts the generation on the
survivors, sends that version through the object store, and the next publication opens a new generation
(a replacement engine included).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta

import torch

from gyre.cluster.weights import WeightBundle, WeightManifest, bucket_checksum, bucket_views, stage_buckets
from gyre.engines import memory

_POLL_S = 0.2
"""How often a wait on the group looks at the abort flag and its deadline."""
SOLO_BYTES = 1 << 20
"""Tensors this large travel in a bucket of their own, which an engine receives straight into its weight."""
_GRACE_S = 10.0
"""The group's own timeout is the transfer's deadline plus this, so the deadline's clearer error comes first."""


class ChannelAborted(RuntimeError):
    """A broadcast on the channel was abandoned: the driver aborted the generation, or it passed its deadline."""


@dataclass(frozen=True)
class ChannelSpec:
    """Where a weight channel's members meet, and the generation they build a group for."""

    host: str
    port: int
    world_size: int
    """The sender and every engine."""
    backend: str
    """nccl (engines and sender on GPUs) or gloo."""
    timeout_s: float
    """Deadline of one publication's transfer (and of building the group)."""
    generation: int = 0

    def renewed(self) -> ChannelSpec:
        """The next generation: every member builds a fresh group on its next transfer."""
        return replace(self, generation=self.generation + 1)


@dataclass(frozen=True)
class ChannelWeights:
    """What an engine is given to load a version from the channel."""

    manifest: WeightManifest
    spec: ChannelSpec


class ChannelMember:
    """One process's membership in a weight channel: its group for the current generation, and the abort flag
    the driver sets (from another thread) to free a member stuck in a broadcast."""

    def __init__(self, device: torch.device):
        self.device = device
        self._group = None
        self._generation: int | None = None
        self._store = None
        self._aborted_upto = -1
        """Generations the driver abandoned (set from another thread; read between waits)."""
        self._abandoned: list = []
        """Groups left with a broadcast pending: kept referenced, so no destructor waits on it."""

    def host(self, world_size: int, backend: str, timeout_s: float) -> ChannelSpec:
        """Rank 0 (the sender) hosts the channel's TCP store; returns the spec the members join by."""
        import ray

        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
        self._store = torch.distributed.TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False,
                                                 timeout=timedelta(seconds=timeout_s))
        return ChannelSpec(host, self._store.port, world_size, backend, timeout_s)

    def abort(self, generation: int) -> None:
        """Abandon ``generation``: a broadcast waiting on it raises ``ChannelAborted``, and the next transfer
        builds the next generation's group."""
        self._aborted_upto = max(self._aborted_upto, generation)

    def _join(self, spec: ChannelSpec, rank: int, deadline: float):
        """This generation's group: built on the first transfer of the generation (every member must arrive)."""
        if spec.generation <= self._aborted_upto:
            raise ChannelAborted(f"weight channel generation {spec.generation} was aborted")
        if self._generation == spec.generation and self._group is not None:
            return self._group
        self._drop()
        built: dict = {}

        def build() -> None:
            try:
                built["group"] = self._build(spec, rank)
            except Exception as exc:  # noqa: BLE001 - handed to the waiting thread
                built["error"] = exc
            done.set()

        # Built on a thread of its own: gloo connects the full mesh inside the constructor, which a lost member
        # would hold until the group's timeout; the wait here ends at an abort or the deadline instead.
        done = threading.Event()
        threading.Thread(target=build, daemon=True, name="gyre-weight-channel").start()
        self._wait(done, spec, deadline, "building its group")
        if "error" in built:
            raise ChannelAborted(f"weight channel generation {spec.generation}: building its group failed: "
                                 f"{built['error']}") from built["error"]
        self._group, self._generation = built["group"], spec.generation
        return self._group

    def _build(self, spec: ChannelSpec, rank: int):
        store = self._store if rank == 0 and self._store is not None else torch.distributed.TCPStore(
            spec.host, spec.port, spec.world_size, is_master=False, timeout=timedelta(seconds=spec.timeout_s))
        prefixed = torch.distributed.PrefixStore(f"gyre-weights/{spec.generation}", store)
        timeout = timedelta(seconds=spec.timeout_s + _GRACE_S)  # past the transfer's deadline: it speaks first
        if spec.backend == "nccl":
            return torch.distributed.ProcessGroupNCCL(prefixed, rank, spec.world_size, _nccl_options(timeout))
        return torch.distributed.ProcessGroupGloo(prefixed, rank, spec.world_size, timeout)

    def _wait(self, done: threading.Event, spec: ChannelSpec, deadline: float, what: str) -> None:
        """Wait for ``done`` in slices: an abort of this generation or the deadline ends the wait."""
        while not done.wait(_POLL_S):
            if spec.generation <= self._aborted_upto:
                self._drop()
                raise ChannelAborted(f"weight channel generation {spec.generation} aborted while {what}")
            if time.monotonic() > deadline:
                self._drop()
                raise ChannelAborted(f"weight channel generation {spec.generation}: no transfer within "
                                     f"{spec.timeout_s:.0f} s while {what} (a member is missing or stalled)")

    def _drop(self) -> None:
        if self._group is not None:
            self._abandoned.append(self._group)
        self._group, self._generation = None, None

    def _start(self, tensor: torch.Tensor):
        """Post a broadcast of ``tensor`` from rank 0; ``_finish`` waits for it. Posted in order, several at
        once: the group runs them in that order on every member, so a receiver checks one bucket while the
        next arrives."""
        work = self._group.broadcast(tensor, 0)
        done = threading.Event()
        work.get_future().add_done_callback(lambda _: done.set())
        return work, done

    def _finish(self, posted, spec: ChannelSpec, deadline: float) -> None:
        work, done = posted
        self._wait(done, spec, deadline, "broadcasting")
        try:
            work.wait()  # raises the group's own error, if it failed (a member gone)
        except RuntimeError as exc:
            self._drop()
            raise ChannelAborted(f"weight channel generation {spec.generation}: a broadcast failed: {exc}") from exc

    def _broadcast(self, tensor: torch.Tensor, spec: ChannelSpec, deadline: float) -> None:
        self._finish(self._start(tensor), spec, deadline)

    def send(self, spec: ChannelSpec, buckets: list[torch.Tensor], manifest: WeightManifest) -> int:
        """Rank 0: broadcast every bucket of the manifest's version after its header; returns the bytes sent."""
        deadline = time.monotonic() + spec.timeout_s
        self._join(spec, 0, deadline)
        device = buckets[0].device if buckets else self.device
        headers = torch.tensor([[manifest.version, index, bucket.numel(), checksum] for index, (bucket, checksum)
                                in enumerate(zip(buckets, manifest.checksums))], dtype=torch.int64, device=device)
        posted = [self._start(headers), *(self._start(bucket) for bucket in buckets)]
        for item in posted:
            self._finish(item, spec, deadline)
        if buckets and buckets[0].is_cuda:
            torch.cuda.current_stream().synchronize()
        return sum(b.numel() for b in buckets)

    def receive(self, weights: ChannelWeights, rank: int,
                targets: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """An engine (``rank`` >= 1): every bucket of the manifest's version, each checked against its header
        and the manifest; returns the tensors as views into what received them. A bucket holding one tensor
        of ``targets`` (the engine's own weights, by name) of the same dtype, shape and device arrives
        straight in it: no buffer, no copy (if the transfer fails, the driver reloads the whole version)."""
        spec, manifest = weights.spec, weights.manifest
        deadline = time.monotonic() + spec.timeout_s
        self._join(spec, rank, deadline)
        headers = torch.zeros((len(manifest.sizes), 4), dtype=torch.int64, device=self.device)
        direct = _direct_targets(manifest, targets or {}, self.device)
        buckets = [direct[index] if index in direct else torch.empty(size, dtype=torch.uint8, device=self.device)
                   for index, size in enumerate(manifest.sizes)]
        posted = [self._start(headers), *(self._start(b) for b in buckets)]
        self._finish(posted[0], spec, deadline)
        for index, (header, bucket, got) in enumerate(zip(headers.tolist(), buckets, posted[1:])):
            self._finish(got, spec, deadline)
            if bucket.is_cuda:
                torch.cuda.current_stream().synchronize()
            expected = (manifest.version, index, manifest.sizes[index], manifest.checksums[index])
            version, got_index, nbytes, checksum = header
            if (version, got_index, nbytes) != expected[:3]:
                raise RuntimeError(f"weight channel: bucket {got_index} of version {version} ({nbytes} bytes) arrived "
                                   f"where bucket {index} of version {manifest.version} ({expected[2]} bytes) was "
                                   "expected")
            if checksum != expected[3] or bucket_checksum(bucket) != checksum:
                raise RuntimeError(f"weight channel: bucket {index} of version {version} is corrupt "
                                   "(checksum mismatch)")
        return bucket_views(buckets, manifest.metas)


def _direct_targets(manifest: WeightManifest, targets: dict[str, torch.Tensor], device: torch.device) -> dict:
    """Bucket index -> the bytes of the target tensor it can arrive in (a bucket holding exactly one tensor
    whose target matches it)."""
    counts = collections.Counter(m.bucket for m in manifest.metas)
    direct = {}
    for m in manifest.metas:
        t = targets.get(m.name)
        if (t is not None and counts[m.bucket] == 1 and m.offset == 0 and m.nbytes == manifest.sizes[m.bucket]
                and str(t.dtype).removeprefix("torch.") == m.dtype and tuple(t.shape) == m.shape
                and t.device == device and t.is_contiguous()):
            direct[m.bucket] = t.detach().view(-1).view(torch.uint8)
    return direct


def _nccl_options(timeout: timedelta):
    options = torch.distributed.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return options


class Sender:
    """The policy rank 0 side: publications staged on its device until the driver loads them."""

    def __init__(self, device: torch.device):
        self.member = ChannelMember(device)
        self._staged: dict[int, tuple[list[torch.Tensor], WeightManifest]] = {}
        self._copied: dict[int, object] = {}
        """Sent versions whose host copy is under way: the CUDA event that marks its end."""
        self._lock = threading.Lock()

    def stage(self, tensors, version: int, lora: dict | None = None, bucket_bytes: int | None = None) -> WeightManifest:
        """Copy ``tensors`` (name, tensor pairs, in the engines' dtype) into buckets on this device as
        ``version``, with each bucket's checksum; earlier versions stay staged until sent (a held lockstep
        publication)."""
        kwargs = {"bucket_bytes": bucket_bytes} if bucket_bytes else {}
        buckets, metas = stage_buckets(tensors, self.member.device, solo_bytes=SOLO_BYTES, **kwargs)
        manifest = WeightManifest(version, metas, [b.numel() for b in buckets], [bucket_checksum(b) for b in buckets],
                                  lora)
        with self._lock:
            self._staged[version] = (buckets, manifest)
        return manifest

    def send(self, spec: ChannelSpec, version: int) -> int:
        """Broadcast staged ``version`` to the engines. Once sent, older versions are dropped and this one
        moves to host memory: a replacement engine may still need it (through the object store)."""
        with self._lock:
            buckets, manifest = self._staged[version]
        sent = self.member.send(spec, buckets, manifest)
        with self._lock:
            for v in [v for v in self._staged if v < version]:
                del self._staged[v]
                self._copied.pop(v, None)
            if buckets and buckets[0].device.type == "cuda":
                # Asynchronous copies into pinned memory: the publication is done once the engines have the
                # weights, not once the host copy is (for 7B, seconds through pageable memory); ``bundle``,
                # which alone reads it, waits for them.
                self._staged[version] = ([memory.to_host(b) for b in buckets], manifest)
                self._copied[version] = torch.cuda.Event()
                self._copied[version].record()
        return sent

    def bundle(self, version: int) -> WeightBundle:
        """Staged (or last sent) ``version`` as an object-store bundle."""
        with self._lock:
            buckets, manifest = self._staged[version]
            copied = self._copied.get(version)
        if copied is not None:
            copied.synchronize()
        host = [b.cpu() for b in buckets]  # host checksums: the object store's adler32
        return WeightBundle(version, manifest.metas, [b.numpy() for b in host], [bucket_checksum(b) for b in host],
                            manifest.lora)


@dataclass
class ChannelPublication:
    """A version staged on the sender, for the rollout driver to load (``RolloutDriver.load_weights``). Built
    by the learner, whose closures know the policy group and the channel's current generation."""

    manifest: WeightManifest
    start: Callable[[], tuple[ChannelWeights, object]]
    """Start the sender's broadcast on the current generation: what every engine is given, and the
    sender's ref."""
    sent: Callable[[object], int]
    """Wait for the sender's ref (within the policy call's deadline); the bytes sent."""
    to_store: Callable[[], list]
    """The same version as object-store refs (a ``WeightBundle``): after a failed broadcast, and for a
    replacement engine."""
    failed: Callable[[ChannelWeights], None]
    """Abandon the generation of that transfer on the sender: the next publication builds a new one."""
    _refs: list | None = None

    @property
    def version(self) -> int:
        return self.manifest.version

    def store_refs(self) -> list:
        """``to_store()``, made once."""
        if self._refs is None:
            self._refs = self.to_store()
        return self._refs
