"""What a step costs on a device: a roofline of FLOPs and memory traffic, with efficiency factors.

A decoding step of ``B`` rows whose contexts sum to ``C`` tokens reads the weights once and every row's
KV cache, and does ``2 P B`` FLOPs (P parameters): its time is ``overhead + max(compute, launch, memory)``
(``additive`` devices, such as a CPU running a small model from Python, pay the sum instead: nothing
overlaps there). ``launch`` is the host's time launching an eager engine's kernels (``EngineClass``),
which the device's work hides when longer; an engine whose cache is padded to the widest row reads
``B x widest`` tokens of KV instead of ``C`` (the simulated engine passes that as the context). Prefill is
compute-bound (``2 P T`` FLOPs for T tokens). Training a batch of T tokens costs ``6 P T`` FLOPs at the
device's training MFU, each extra forward pass (old and reference log-probs) ``2 P T``.

A weight update follows the transport the config selects (``transport``; W the weights' bytes):

* ``none``: hybrid engines are the policy ranks: a round of calls (the version stamp). ``gather``: hybrid
  FSDP2 ranks also all-gather a full copy, ~W over the link.
* ``channel``: rank 0 stages the weights on its device (cast, bucket copy, checksum: ~3 passes over W at
  memory bandwidth), broadcasts them (W over NVLink within a node, the network across nodes, plus a
  per-bucket cost); its host copy for replacement engines (into pinned memory) runs asynchronously
  after the broadcast, off the publish's path. The engines pause only for the broadcast.
* ``object_store``: rank 0 copies W to pageable host buckets, checksums them and puts them in Ray's store
  (2 host passes); each engine, in parallel, pulls them (across nodes: over TCP), checksums them and
  copies them to its device (pageable). The engines pause for their part.
* None: the generic model, for systems other than gyre: ``sync_overhead_s + W / link_gbps`` for both.

Device classes, engine classes and model shapes are data (``gyre.config.catalog``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gyre.config.catalog import GENERIC_ENGINE, DeviceClass, EngineClass, ModelShape

TRANSPORTS = ("none", "gather", "channel", "object_store")
"""What ``CostModel.transport`` may name (None: the generic model)."""
BUCKET_S = 5e-4
"""Cost of one bucket on the weight channel (a broadcast's launch, the receiver's sync and checksum; a gloo
message's latency is about this on this machine's CPU, reference/platform.md). An estimate on GPUs."""


@dataclass(frozen=True)
class CostModel:
    """Seconds of each kind of work for one model on one device class; rollout engines span ``tp`` devices."""

    device: DeviceClass
    model: ModelShape
    tp: int = 1
    engine: EngineClass = GENERIC_ENGINE
    """The rollout backend's way of decoding (``gyre.config.catalog.engine_class``)."""
    transport: str | None = None
    """How weights reach the engines: none, gather, channel, object_store; None: the generic model."""
    same_node: bool = True
    """The trainer and every engine share a node (else the weights cross the network)."""

    def __post_init__(self) -> None:
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise ValueError(f"unknown weight transport {self.transport!r}: one of {TRANSPORTS}, or None")
        # The roofline's coefficients, once: a simulation asks for spans hundreds of thousands of times.
        e = self.engine
        flops = self.device.peak_tflops * 1e12 * self.device.compute_eff * e.compute_scale * self.tp
        bandwidth = self.device.mem_gbps * 1e9 * self.device.mem_eff * e.mem_scale * self.tp
        object.__setattr__(self, "_overhead", self.device.step_overhead_s * e.overhead_scale)
        object.__setattr__(self, "_launch", e.layer_launch_s * self.model.layers)
        object.__setattr__(self, "_flops", flops)
        object.__setattr__(self, "_bandwidth", bandwidth)
        object.__setattr__(self, "_row_s", 2 * self.model.params / flops)
        """Compute seconds per row per step."""
        object.__setattr__(self, "_weights_s", self.model.weight_bytes / bandwidth)
        object.__setattr__(self, "_kv_s", self.model.kv_bytes_per_token / bandwidth)
        """Memory seconds per context token per step."""
        object.__setattr__(self, "_sync", self._update())
        """(trainer's wait, an engine's pause) of a weight update: every engine asks at every update."""

    def _combine(self, compute: float, memory: float) -> float:
        return compute + memory if self.device.additive else max(compute, memory)

    # ---- decoding --------------------------------------------------------------------------------
    def decode_step_s(self, rows: int, context: float) -> float:
        """One decoding step of ``rows`` rows whose contexts sum to ``context`` tokens."""
        return self.decode_span_s(rows, context, 1)

    def _terms(self, rows: int, context: float) -> tuple[float, float, float]:
        """Per step: compute (or the kernels' launch, if longer) x, constant; memory y + z j at step j."""
        compute = self._row_s * rows
        x = compute + self._launch if self.device.additive else max(compute, self._launch)
        return x, self._weights_s + self._kv_s * context, self._kv_s * rows

    def _compute_bound_steps(self, x: float, y: float, z: float, steps: int) -> int:
        """Steps (from the first) during which compute exceeds memory time."""
        if self.device.additive or y >= x:
            return 0
        return steps if z == 0 else min(steps, math.ceil((x - y) / z))

    def decode_span_s(self, rows: int, context: float, steps: int) -> float:
        """``steps`` decoding steps of ``rows`` rows, contexts summing to ``context`` at the first (each
        step adds a token to every row), in closed form."""
        if steps <= 0 or rows <= 0:
            return 0.0
        x, y, z = self._terms(rows, context)
        total = steps * self._overhead
        if self.device.additive:
            return total + steps * (x + y) + z * steps * (steps - 1) / 2
        j0 = self._compute_bound_steps(x, y, z, steps)  # max(x, y + z j): compute-bound before j0
        ramp = (steps * (steps - 1) - j0 * (j0 - 1)) / 2
        return total + j0 * x + (steps - j0) * y + z * ramp

    def steps_within(self, rows: int, context: float, budget_s: float, most: int) -> int:
        """The most whole decoding steps (at most ``most``) that fit in ``budget_s`` seconds: the span's
        inverse, solved as a quadratic per regime, then checked against the span itself."""
        if budget_s <= 0 or rows <= 0:
            return 0
        if self.decode_span_s(rows, context, most) <= budget_s:
            return most
        x, y, z = self._terms(rows, context)
        o = self._overhead
        j0 = self._compute_bound_steps(x, y, z, most)
        flat = o + x
        if j0 and budget_s <= j0 * flat:
            k = int(budget_s / flat)
        else:  # memory-bound from j0: m steps cost m (o + y + z j0 [+ x]) + z m (m - 1) / 2
            a, b = z / 2, o + y + z * j0 + (x if self.device.additive else 0.0) - z / 2
            rest = budget_s - j0 * flat
            m = rest / b if a == 0 else (-b + math.sqrt(b * b + 4 * a * rest)) / (2 * a)
            k = j0 + int(m)
        k = max(0, min(most, k))
        while k > 0 and self.decode_span_s(rows, context, k) > budget_s:
            k -= 1
        while k < most and self.decode_span_s(rows, context, k + 1) <= budget_s:
            k += 1
        return k

    def prefill_s(self, tokens: float) -> float:
        """Prefilling ``tokens`` tokens (new prompts, or the KV cache rebuilt after a weight update)."""
        if tokens <= 0:
            return 0.0
        return self._combine(2 * self.model.params * tokens / self._flops, self.model.weight_bytes / self._bandwidth)

    def kv_capacity_tokens(self) -> float:
        """Tokens of KV cache an engine (``tp`` devices) holds beside its weights."""
        free = self.device.mem_gb * 1e9 * self.tp - self.model.weight_bytes
        if free <= 0:
            raise ValueError(f"a {self.model.name} model ({self.model.weight_bytes / 1e9:.0f} GB of weights) does not "
                             f"fit on {self.tp} x {self.device.name} ({self.device.mem_gb:.0f} GB each): raise the "
                             f"rollout tensor parallelism (rollout.tensor_parallel_size, or simulate.rollout_tp)")
        return free * self.device.kv_fraction / self.model.kv_bytes_per_token

    # ---- training --------------------------------------------------------------------------------
    def train_s(self, tokens: float, devices: int, passes: float = 4.0) -> float:
        """A step's training over ``tokens`` tokens on ``devices`` devices: ``passes`` forward passes' worth of
        compute, 2 P T FLOPs each (``gyre.training.plan.StepPasses.forward_equivalents``: a policy update is
        3, a scoring pass 1; the default, 4, is one update and one scoring pass)."""
        return self.train_compute_s(2 * passes * self.model.params * tokens / devices)

    def train_compute_s(self, flops: float) -> float:
        """A training step whose busiest device computes ``flops`` FLOPs (``gyre.sim.learner``: the real
        learner's passes and micro-batches), at the training MFU, plus the step's fixed cost."""
        return self.device.train_overhead_s + flops / (self.device.peak_tflops * 1e12 * self.device.train_mfu)

    # ---- weight updates ------------------------------------------------------------------------------
    def sync_s(self) -> float:
        """A weight update as the trainer waits for it: publish until every engine holds the version."""
        return self._sync[0]

    def load_s(self) -> float:
        """The part of a weight update an engine spends suspended (its clock's share)."""
        return self._sync[1]

    def join_s(self) -> float:
        """A joining engine loads the current version through the object store, as a replacement does (a
        fresh engine is not in the channel's group); in the generic model, a sync."""
        if self.transport is None:
            return self.sync_s()
        return self._object_store(self.model.weight_bytes / 1e9)[1]

    def _update(self) -> tuple[float, float]:
        """(trainer's wait, an engine's pause) of one update over ``transport`` (module docstring)."""
        d, w = self.device, self.model.weight_bytes / 1e9
        if self.transport is None:
            s = d.sync_overhead_s + w / d.link_gbps
            return s, s
        if self.transport in ("none", "gather"):
            s = d.call_s + (w / self._link_gbps() if self.transport == "gather" else 0.0)
            return s, s
        if self.transport == "channel":
            cpu = d.kind == "cpu"
            memory = d.host_gbps if cpu else d.mem_gbps * d.mem_eff  # the sender's device memory
            stage = (2 if cpu else 3) * w / memory  # cast (none on CPU: float32 throughout), bucket copy, checksum
            wire = w / self._link_gbps() + self._buckets() * BUCKET_S
            return d.call_s + stage + wire, d.call_s + wire
        return self._object_store(w)

    def _object_store(self, w: float) -> tuple[float, float]:
        d = self.device
        sender = w / d.pageable_gbps + 2 * w / d.host_gbps  # to host buckets, adler32, ray.put
        # Engines in parallel, each at one process's host bandwidth (8 of them stay within a socket's);
        # on the trainer's node ray.get maps the shared memory, on another it pulls the object first.
        engine = (0.0 if self.same_node else w / d.tcp_gbps) + w / d.host_gbps + w / d.pageable_gbps
        return d.call_s + sender + engine, d.call_s + engine

    def _link_gbps(self) -> float:
        return self.device.peer_gbps if self.same_node else self.device.net_gbps

    def _buckets(self) -> int:
        """Broadcasts of one update: the headers, then tensors of 1 MiB or more alone (a decoder layer's seven
        projection matrices, the embeddings and the head) and the small ones in a shared bucket."""
        return 7 * self.model.layers + 3

    def swap_s(self, train_devices: int) -> float:
        """Time-sharing the devices (colocation), one way: the trainer's state (bf16 weights, fp32 master
        weights and two Adam moments: 14 bytes a parameter, sharded over ``train_devices``) over PCIe."""
        if self.device.additive:  # a CPU swaps nothing
            return 0.0
        return 14 * self.model.params / train_devices / (self.device.pcie_gbps * 1e9)
