"""What a step costs on a device: a roofline of FLOPs and memory traffic, with efficiency factors.

A decoding step of ``B`` rows whose contexts sum to ``C`` tokens reads the weights once and every row's
KV cache, and does ``2 P B`` FLOPs (P parameters): its time is ``overhead + max(compute, memory)``
(``additive`` devices, such as a CPU running a small model from Python, pay the sum instead: nothing
overlaps there). Prefill is compute-bound (``2 P T`` FLOPs for T tokens). Training a batch of T tokens
costs ``6 P T`` FLOPs at the device's training MFU, each extra forward pass (old and reference
log-probs) ``2 P T``. Weight sync moves ``P x bytes`` over the link between trainer and engines.

Device classes and model shapes are data (``gyre.config.catalog``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gyre.config.catalog import DeviceClass, ModelShape


@dataclass(frozen=True)
class CostModel:
    """Seconds of each kind of work for one model on one device class; rollout engines span ``tp`` devices."""

    device: DeviceClass
    model: ModelShape
    tp: int = 1

    def __post_init__(self) -> None:
        # The roofline's coefficients, once: a simulation asks for spans hundreds of thousands of times.
        flops = self.device.peak_tflops * 1e12 * self.device.compute_eff * self.tp
        bandwidth = self.device.mem_gbps * 1e9 * self.device.mem_eff * self.tp
        object.__setattr__(self, "_flops", flops)
        object.__setattr__(self, "_bandwidth", bandwidth)
        object.__setattr__(self, "_row_s", 2 * self.model.params / flops)
        """Compute seconds per row per step."""
        object.__setattr__(self, "_weights_s", self.model.weight_bytes / bandwidth)
        object.__setattr__(self, "_kv_s", self.model.kv_bytes_per_token / bandwidth)
        """Memory seconds per context token per step."""

    def _combine(self, compute: float, memory: float) -> float:
        return compute + memory if self.device.additive else max(compute, memory)

    # ---- decoding --------------------------------------------------------------------------------
    def decode_step_s(self, rows: int, context: float) -> float:
        """One decoding step of ``rows`` rows whose contexts sum to ``context`` tokens."""
        return self.decode_span_s(rows, context, 1)

    def _terms(self, rows: int, context: float) -> tuple[float, float, float]:
        """Per step: compute x (constant), memory y + z j at step j."""
        return self._row_s * rows, self._weights_s + self._kv_s * context, self._kv_s * rows

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
        total = steps * self.device.step_overhead_s
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
        o = self.device.step_overhead_s
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
                             f"rollout tensor parallelism (simulate.rollout_tp)")
        return free * self.device.kv_fraction / self.model.kv_bytes_per_token

    # ---- training --------------------------------------------------------------------------------
    def train_s(self, tokens: float, devices: int, forward_passes: int = 1) -> float:
        """A policy update over ``tokens`` tokens on ``devices`` devices (6 P T FLOPs), plus
        ``forward_passes`` forward passes (2 P T each: old and reference log-probs)."""
        flops = (6 + 2 * forward_passes) * self.model.params * tokens
        return self.device.train_overhead_s + flops / (devices * self.device.peak_tflops * 1e12 * self.device.train_mfu)

    def sync_s(self) -> float:
        """A weight update: the weights over the trainer-to-engine link, plus a fixed cost."""
        return self.device.sync_overhead_s + self.model.weight_bytes / (self.device.link_gbps * 1e9)

    def swap_s(self, train_devices: int) -> float:
        """Time-sharing the devices (colocation), one way: the trainer's state (bf16 weights, fp32 master
        weights and two Adam moments: 14 bytes a parameter, sharded over ``train_devices``) over PCIe."""
        if self.device.additive:  # a CPU swaps nothing
            return 0.0
        return 14 * self.model.params / train_devices / (self.device.pcie_gbps * 1e9)
