"""What a step costs on a device: a roofline of FLOPs and memory traffic, with efficiency factors.

A decoding step of ``B`` rows whose contexts sum to ``C`` tokens reads the weights once and every row's
KV cache, and does ``2 P B`` FLOPs (P parameters): its time is ``overhead + max(compute, memory)``
(``additive`` devices, such as a CPU running a small model from Python, pay the sum instead: nothing
overlaps there). Prefill is compute-bound (``2 P T`` FLOPs for T tokens). Training a batch of T tokens
costs ``6 P T`` FLOPs at the device's training MFU, each extra forward pass (old and reference
log-probs) ``2 P T``. Weight sync moves ``P x bytes`` over the link between trainer and engines.

Device classes are data (``DEVICES``): name, peak dense bf16 TFLOP/s, HBM bandwidth, memory, efficiency
factors and a price per hour (RollArt's hardware-affinity comparison is "at equal cost"). ``cpu`` is
this repository's 2-core CPU running the tiny test model, calibrated by ``bench/sim_calibration.py``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class DeviceClass:
    name: str
    peak_tflops: float
    """Dense bf16 tensor throughput, TFLOP/s."""
    mem_gbps: float
    """Memory bandwidth, GB/s."""
    mem_gb: float
    """Device memory, GB."""
    price_per_hour: float
    """What an hour of one device costs (relative units; RollArt compares pools at equal cost)."""
    compute_eff: float = 0.6
    """Share of peak FLOP/s that prefill and decoding reach."""
    mem_eff: float = 0.75
    """Share of peak bandwidth that decoding's weight and KV reads reach."""
    train_mfu: float = 0.4
    """Model FLOPs utilisation of training (forward and backward)."""
    step_overhead_s: float = 0.004
    """Fixed cost of one decoding step (scheduling, sampling, kernel launches)."""
    train_overhead_s: float = 0.5
    """Fixed cost of a training step (optimizer step, gradient reduction, scheduling)."""
    pcie_gbps: float = 25.0
    """Host-to-device bandwidth, GB/s (colocated roles swap their state over it)."""
    link_gbps: float = 25.0
    """Bandwidth of a weight update from the trainer to an engine, GB/s."""
    sync_overhead_s: float = 1.0
    """Fixed cost of a weight update (suspend, barrier, resume)."""
    kv_fraction: float = 0.9
    """Share of the memory left after the weights that the KV cache may take."""
    additive: bool = False
    """Compute and memory time add up instead of overlapping (small models on a CPU)."""


DEVICES: dict[str, DeviceClass] = {
    # Public spec-sheet figures (dense bf16, SXM); prices are relative: an H20 costs a third of an H800
    # (RollArt's 6 x H20 = 2 x H800 cost-equivalent pools).
    "h100": DeviceClass("h100", 989.0, 3350.0, 80.0, 3.0),
    "h800": DeviceClass("h800", 989.0, 3350.0, 80.0, 3.0),
    "h200": DeviceClass("h200", 989.0, 4800.0, 141.0, 3.8),
    "h20": DeviceClass("h20", 148.0, 4000.0, 96.0, 1.0),
    "a100": DeviceClass("a100", 312.0, 2039.0, 80.0, 1.8),
    "l40s": DeviceClass("l40s", 362.0, 864.0, 48.0, 1.1),
    # Calibrated on this repository's 2-core CPU with the tiny model (bench/sim_calibration.py both: the
    # sync-hybrid run's in-run generate and trainer times over the engine and training microbenchmarks'
    # shapes; bench/results/sim_calibration.md). peak/mem are what the in-run decode costs per row and per
    # context token imply; train_mfu > 1 only says batched training gets more FLOP/s than decoding does.
    "cpu": DeviceClass("cpu", 0.019, 1.19, 8.0, 0.05, compute_eff=1.0, mem_eff=1.0, train_mfu=2.275,
                       step_overhead_s=0.001033, train_overhead_s=0.0, link_gbps=1.19, sync_overhead_s=0.002028,
                       additive=True),
}


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a model: its size and the size of its KV cache per token."""

    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_param: int = 2

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """Keys and values of every layer, bf16."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 2

    @classmethod
    def from_hf_config(cls, path: str | Path, name: str | None = None) -> ModelShape:
        """From a local model directory's ``config.json`` (parameters counted from its shapes)."""
        path = Path(path)
        cfg = json.loads((path / "config.json" if path.is_dir() else path).read_text())
        h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
        heads = cfg["num_attention_heads"]
        kv, head_dim = cfg.get("num_key_value_heads", heads), cfg.get("head_dim") or h // heads
        inter = cfg.get("intermediate_size", 4 * h)
        per_layer = h * head_dim * (heads * 2 + kv * 2) + 3 * h * inter
        embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
        return cls(name or path.name, float(layers * per_layer + embed), layers, kv, head_dim)


MODELS: dict[str, ModelShape] = {
    # Qwen2.5 / Qwen3 shapes (parameters, layers, KV heads, head dim), the sizes the ROLL papers train.
    "0.5b": ModelShape("0.5b", 0.49e9, 24, 2, 64),
    "1.5b": ModelShape("1.5b", 1.54e9, 28, 2, 128),
    "3b": ModelShape("3b", 3.09e9, 36, 2, 128),
    "7b": ModelShape("7b", 7.6e9, 28, 4, 128),
    "8b": ModelShape("8b", 8.2e9, 36, 8, 128),
    "14b": ModelShape("14b", 14.7e9, 48, 8, 128),
    "32b": ModelShape("32b", 32.5e9, 64, 8, 128),
}


def model_shape(name: str) -> ModelShape:
    """A named size ("7b") or a local model directory."""
    if name.lower() in MODELS:
        return MODELS[name.lower()]
    path = Path(name)
    if (path / "config.json").is_file():
        return ModelShape.from_hf_config(path)
    raise ValueError(f"unknown model size {name!r}: give one of {sorted(MODELS)} or a local model directory "
                     f"with a config.json")


def device_class(name: str, overrides: dict | None = None) -> DeviceClass:
    if name.lower() not in DEVICES:
        raise ValueError(f"unknown device class {name!r}: give one of {sorted(DEVICES)}")
    return replace(DEVICES[name.lower()], **(overrides or {}))


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
