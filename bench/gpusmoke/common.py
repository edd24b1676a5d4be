"""What the GPU smoke check's sections share: their context, timing on the device, memory readings, and
the model shapes they build (random weights, nothing downloaded)."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

GIB = 2**30

MID_GPU = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
               num_key_value_heads=2, vocab_size=151_936, tie_word_embeddings=True, max_position_embeddings=8192)
"""Qwen2.5-0.5B's dimensions in a Llama config (no attention biases): the trainer, sampling, transport and
packing sections' model on a GPU. Llama, not Qwen2: transformers maps Qwen2 directories to a tokenizer
class that drops spaces from the character tokenizer saved beside it."""
QWEN2_7B = dict(hidden_size=3584, intermediate_size=18_944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152_064, tie_word_embeddings=False, max_position_embeddings=32_768,
                rope_theta=1_000_000.0, rms_norm_eps=1e-6)
"""Qwen2-7B's shape (7.6 B parameters, 15.2 GB in bf16)."""
QWEN2_TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=False, max_position_embeddings=1024)
"""The same architecture at a size a 2-core CPU decodes in a second (the CPU run)."""


@dataclass
class Ctx:
    """One section's run: where, how big, and what earlier sections measured."""

    gpu: bool
    work: Path
    """Scratch shared by the sections of one run (the model directories ``prepare`` writes)."""
    root: Path
    """The checkout (the tests' home)."""
    smoke: bool = False
    """The smallest run (CI's bench-smoke): parts that only cost time on a CPU are left out."""
    prior: dict = field(default_factory=dict)
    """Results of the sections that ran before, by name."""
    budget_s: float = 600.0
    """Seconds this section may run before it is stopped (a section that starts processes stops them first)."""
    result_path: Path | None = None
    """Where the section's result goes; ``save`` writes what it has so far there, kept if it is stopped."""

    def save(self, partial: dict) -> None:
        """Write the result so far: a section stopped at its time box still reports what it measured."""
        if self.result_path is not None:
            import json

            part = self.result_path.with_suffix(".part")
            part.write_text(json.dumps(partial, indent=1, default=str))
            part.replace(self.result_path)  # whole or not at all, should the section be stopped mid-write

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", 0) if self.gpu else torch.device("cpu")

    @property
    def mid(self) -> Path:
        return self.work / "mid"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, repeat: int = 1, warmup: int = 0) -> tuple[float, object]:
    """Median seconds of ``repeat`` calls of ``fn`` after ``warmup`` untimed ones (device work included), and
    the last call's result."""
    out = None
    for _ in range(warmup):
        out = fn()
    sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def allocated(device: torch.device) -> int | None:
    """Bytes the caching allocator hands out now (None off CUDA: nothing comparable there)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def peak(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def gib(nbytes: float | None) -> float | None:
    return None if nbytes is None else round(nbytes / GIB, 3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_rank_group(device: torch.device) -> None:
    """A one-rank process group (NCCL on a GPU, gloo on CPU), as a trainer rank runs under."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)


def random_ids(rows: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Token ids past the character tokenizer's specials (ids 0-3), reproducible."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (rows, length), generator=g).tolist()


def model_vocab(path: Path) -> int:
    import json

    return int(json.loads((path / "config.json").read_text())["vocab_size"])


def write_mid_model(ctx: Ctx) -> dict:
    """The sections' model directory (``ctx.mid``): Qwen2.5-0.5B's dimensions on a GPU (initialised there,
    saved in float32), the tiny preset on CPU; with the character tokenizer, which drops ids it lacks."""
    from gyre.models.presets import build_char_tokenizer, init_model

    if not ctx.gpu:
        init_model("tiny", ctx.mid, seed=0)
        return {"model": "tiny preset (Llama, hidden 128, 2 layers)"}
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_char_tokenizer(MID_GPU["max_position_embeddings"])
    config = LlamaConfig(**MID_GPU, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(ctx.device):  # initialised on the GPU: seconds, not a minute of CPU time
        model = LlamaForCausalLM(config)
    model.save_pretrained(ctx.mid)
    tokenizer.save_pretrained(ctx.mid)
    params = sum(p.numel() for p in model.parameters())
    return {"model": "Qwen2.5-0.5B dimensions (Llama config, random weights)", "params": params}


def qwen2(ctx: Ctx):
    """A random Qwen2 model of 7B's shape in bf16 built on the GPU (the CPU run: the tiny one, float32), and
    its config written to ``work/qwen2.json`` for the memory pre-flight's shape."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    dims = QWEN2_7B if ctx.gpu else QWEN2_TINY
    config = Qwen2Config(**dims, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    (ctx.work / "qwen2.json").write_text(config.to_json_string(use_diff=False))  # every size, defaults too
    torch.manual_seed(0)
    with torch.device(ctx.device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if ctx.gpu else torch.float32)
    return model.eval()
