"""What ``gyre simulate`` and the config know of hardware and models: device classes and model shapes.

Device classes are data (``DEVICES``): name, peak dense bf16 TFLOP/s, HBM bandwidth, memory, efficiency
factors, the links a weight update crosses, and a price per hour (RollArt's hardware-affinity comparison
is "at equal cost"). ``cpu`` is this repository's 2-core CPU running the tiny test model, calibrated by
``bench/sim_calibration.py``. Engine classes (``ENGINES``) say how gyre's rollout backends spend a
decoding step against a device class's figures. Model shapes (``MODELS``) are the sizes the ROLL papers
train. The cost model that prices work on them is ``gyre.sim.cost``; the config names their keys
(``simulate.device``, ``simulate.model``, ``rollout.backend``).
"""

from __future__ import annotations

import json
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
    """Bandwidth of a weight update from the trainer to an engine, GB/s, in the generic model of a sync
    (``CostModel`` with no transport: a system other than gyre, such as the papers' in ``bench/sim_claims.py``)."""
    sync_overhead_s: float = 1.0
    """Fixed cost of a weight update (suspend, barrier, resume), in the same generic model."""
    kv_fraction: float = 0.9
    """Share of the memory left after the weights that the KV cache may take."""
    additive: bool = False
    """Compute and memory time add up instead of overlapping (small models on a CPU)."""
    # What gyre's weight transports cross (``gyre.sim.cost.CostModel.sync_s``). GPU figures are public link
    # rates less what NCCL or a copy typically reaches: estimates, not measurements of gyre.
    kind: str = "cuda"
    """cuda (a GPU: the weight channel is NCCL) or cpu (a CPU slot: gloo, and device memory is host memory)."""
    peer_gbps: float = 350.0
    """Bandwidth an NCCL broadcast reaches between devices of one node, GB/s (NVLink 4: 450 GB/s a direction)."""
    net_gbps: float = 40.0
    """Bandwidth a broadcast reaches between nodes, per device, GB/s (a 400 Gb/s NIC per GPU)."""
    host_gbps: float = 5.0
    """Host memory bandwidth of one process's copy or checksum pass (packing buckets into fresh pages, adler32,
    the object store's put), GB/s: a few GB/s a core on server CPUs."""
    tcp_gbps: float = 2.0
    """Bandwidth of Ray's object store pulling an object from another node (TCP on the hosts' network), GB/s."""
    node_devices: int = 8
    """Devices per node: a layout of more devices spans nodes, and the weights cross the network."""
    call_s: float = 0.05
    """Fixed cost of a round of calls to every engine (suspend at a step boundary, load, resume): a weight
    update's floor, and all a hybrid update costs (the version stamp)."""

    @property
    def pageable_gbps(self) -> float:
        """Copies between the device and pageable host memory (the object store's buffers): the driver stages
        them through a pinned buffer, a host copy then the DMA; on a CPU, a host copy."""
        return self.host_gbps if self.kind == "cpu" else 1 / (1 / self.pcie_gbps + 1 / self.host_gbps)


DEVICES: dict[str, DeviceClass] = {
    # Public spec-sheet figures (dense bf16, SXM); prices are relative: an H20 costs a third of an H800
    # (RollArt's 6 x H20 = 2 x H800 cost-equivalent pools).
    # Links: H100, H200 and H20 have NVLink 4 (900 GB/s both ways), the H800 a cut one (400 GB/s), the
    # A100 NVLink 3 (600 GB/s) and HDR 200 Gb/s NICs, the L40S none (PCIe 4 and commodity Ethernet).
    "h100": DeviceClass("h100", 989.0, 3350.0, 80.0, 3.0),
    "h800": DeviceClass("h800", 989.0, 3350.0, 80.0, 3.0, peer_gbps=150.0),
    "h200": DeviceClass("h200", 989.0, 4800.0, 141.0, 3.8),
    "h20": DeviceClass("h20", 148.0, 4000.0, 96.0, 1.0),
    "a100": DeviceClass("a100", 312.0, 2039.0, 80.0, 1.8, peer_gbps=230.0, net_gbps=20.0),
    "l40s": DeviceClass("l40s", 362.0, 864.0, 48.0, 1.1, peer_gbps=15.0, net_gbps=10.0),
    # Calibrated on this repository's 2-core CPU with the tiny model (bench/sim_calibration.py both: the
    # sync-hybrid run's in-run generate and trainer times over the engine and training microbenchmarks'
    # shapes; bench/results/sim_calibration.md). peak/mem are what the in-run decode costs per row and per
    # context token imply; train_mfu > 1 only says batched training gets more FLOP/s than decoding does.
    # Weights: gloo on loopback (a 95 MB all-reduce takes 110 ms here, reference/platform.md), host copies
    # and checksums ~1.5 GB/s (ray.put + get of 100 MB: 0.06 s; adler32 2.7 GB/s, a copy into fresh memory
    # 1.0 GB/s), so the channel is ~1.4x the object store on a large model (bench/weight_transport.py: 1.34x at
    # 336 MB); call_s is the hybrid run's measured weight sync.
    "cpu": DeviceClass("cpu", 0.019, 1.19, 8.0, 0.05, compute_eff=1.0, mem_eff=1.0, train_mfu=2.275,
                       step_overhead_s=0.001033, train_overhead_s=0.0, link_gbps=1.19, sync_overhead_s=0.002028,
                       additive=True, kind="cpu", peer_gbps=0.9, net_gbps=0.9, host_gbps=1.5, tcp_gbps=0.9,
                       node_devices=2, call_s=0.002028),
}


@dataclass(frozen=True)
class EngineClass:
    """How a rollout backend spends a decoding step, against the device class's figures: those are a
    vLLM-class engine's with CUDA graphs on GPUs, and gyre's HF engine's on the calibrated CPU."""

    name: str
    layer_launch_s: float = 0.0
    """Host seconds launching one decoder layer's kernels each step (eager PyTorch, no CUDA graphs). The
    device's work hides it when that is longer (the host runs ahead until the step's one sync)."""
    overhead_scale: float = 1.0
    """Multiplies the device's step_overhead_s."""
    compute_scale: float = 1.0
    """Multiplies the device's compute_eff."""
    mem_scale: float = 1.0
    """Multiplies the device's mem_eff."""
    padded_kv: bool = False
    """Every row's KV read spans the batch's widest row (one cache left-padded to a width), not its own length."""
    admission: str = "paged"
    """How a request joins the running batch, knowing nothing of its final length: paged (vLLM, and the papers'
    engines): while the tokens the rows hold now fit the KV cache, the newest row preempted (recomputed later)
    when the growing rows no longer fit; reserve (gyre's HF engine, ``KVBatch.reserve``): while rows x the
    widest row's final length (prompt + the token budget) fits, so no row is ever preempted."""


GENERIC_ENGINE = EngineClass("generic")
"""The device class's figures as they are (a system other than gyre; the calibrated CPU's own engine)."""

ENGINES: dict[tuple[str, str], EngineClass] = {
    # Estimates, not measurements (no GPU run of gyre's engines is recorded yet). gyre builds vLLM with
    # enforce_eager=True (gyre/engines/vllm_rollout.py): no CUDA graphs, but fused kernels, ~10 launches a
    # layer: ~0.1 ms. gyre's HF engine is transformers in eager PyTorch: ~50 kernels a decoder layer (RMSNorm
    # unfused, rotary, projections, masked SDPA, MLP) at ~15 us of Python and dispatch each: ~0.8 ms a layer,
    # 22 ms a step for a 28-layer 7B (PyTorch's gpt-fast post measured eager LLaMA-7B at 25.5 tokens/s on an
    # A100, ~1 ms a layer above the weight read). Its masked SDPA and unfused element-wise ops reach less
    # bandwidth (0.8x, a guess), and its cache is left-padded to the widest row (gyre/engines/kv_batch.py).
    ("vllm", "cuda"): EngineClass("vllm", layer_launch_s=1e-4),
    ("hf", "cuda"): EngineClass("hf", layer_launch_s=8e-4, mem_scale=0.8, padded_kv=True, admission="reserve"),
    # The cpu class is fitted to the HF engine's in-run decoding, padding included; vLLM decoded the same
    # samples 1.5-2.6x faster on this CPU (reference/platform.md): 2x.
    ("hf", "cpu"): EngineClass("hf", admission="reserve"),
    ("vllm", "cpu"): EngineClass("vllm", overhead_scale=0.5, compute_scale=2.0, mem_scale=2.0),
}


def engine_class(backend: str, device: DeviceClass) -> EngineClass:
    """How ``backend`` (rollout.backend: hf or vllm) decodes on ``device``."""
    return ENGINES[backend, device.kind]


@dataclass(frozen=True)
class ModelShape:
    """What the cost model needs of a model: its size and the size of its KV cache per token."""

    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_param: int = 2
    hidden: int = 0
    """Hidden size, for activation memory (0: unknown; ``hidden_size`` then assumes 8 query heads per KV head)."""
    vocab: int = 151_936
    """Vocabulary size (the logits' width)."""

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
        return cls(name or path.name, float(layers * per_layer + embed), layers, kv, head_dim, hidden=h, vocab=vocab)

    @property
    def hidden_size(self) -> int:
        return self.hidden or 8 * self.kv_heads * self.head_dim


MODELS: dict[str, ModelShape] = {
    # Qwen2.5 / Qwen3 shapes (parameters, layers, KV heads, head dim), the sizes the ROLL papers train.
    "0.5b": ModelShape("0.5b", 0.49e9, 24, 2, 64, hidden=896),
    "1.5b": ModelShape("1.5b", 1.54e9, 28, 2, 128, hidden=1536),
    "3b": ModelShape("3b", 3.09e9, 36, 2, 128, hidden=2048),
    "7b": ModelShape("7b", 7.6e9, 28, 4, 128, hidden=3584, vocab=152_064),
    "8b": ModelShape("8b", 8.2e9, 36, 8, 128, hidden=4096),
    "14b": ModelShape("14b", 14.7e9, 48, 8, 128, hidden=5120),
    "32b": ModelShape("32b", 32.5e9, 64, 8, 128, hidden=5120),
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
