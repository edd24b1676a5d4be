"""Peak memory and time of the trainer's memory levers against the plain path, side by side.

One policy training step (forward, backward, AdamW step through gyre's TrainerBackend, DDP on one
rank) and one log-prob scoring pass (what the reference and old-log-prob passes run) on a batch of
rows of very different lengths, as RL batches are. Each configuration runs in a fresh process. Memory
is what the step adds to the process: on CPU the peak resident set (VmHWM, reset before the measured
pass) minus the resident set before it, with glibc mapping every block of 64 KiB or more on its own so
that the resident set follows the live tensors; on a GPU torch.cuda.max_memory_allocated over the same
span. Gradients, activations and logits count; the loaded weights and the optimizer state do not.
Times are the fastest of the repeats: wall seconds on a GPU, CPU seconds of one thread on a CPU (a
machine shared with other work inflates wall time, not the work done).

Two models: the `base` preset as gyre builds it (512 wide, 8 layers, a 100-token character vocabulary)
and the same shape with a 32,000-token vocabulary, where the [tokens, vocabulary] logits weigh what they
do in real models (Llama 2's vocabulary; Qwen 2.5's is 151,936).

``--smoke``: the smallest run of the same path: the `tiny` preset's shape with the 32,000-token vocabulary,
4 rows of <= 128 tokens, once, plain against all levers with checkpointing (every lever in one process).

    python bench/memory_levers.py [--rows 12] [--max-len 320] [--repeats 2] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET = "budget"
"""A token budget of MICRO_ROWS average rows: about as many passes as MICRO_ROWS-row micro-batches, without
their padding."""
CHUNK = 256
"""Tokens per log-prob chunk, well under a micro-batch's: a chunk's backward adds one [vocabulary, hidden]
gradient buffer, which pays off only when the micro-batch's logits it replaces are larger."""
CONFIGS = {
    "plain": {},
    "sort": {"remove_padding": "sort"},
    "pack + tokens": {"remove_padding": "pack", "micro_batch_tokens": BUDGET},
    "chunked log-probs": {"logprob_chunk_tokens": CHUNK},
    "all three": {"remove_padding": "pack", "micro_batch_tokens": BUDGET, "logprob_chunk_tokens": CHUNK},
    "plain + checkpointing": {"checkpointing": True},
    "all + checkpointing": {"remove_padding": "pack", "micro_batch_tokens": BUDGET, "logprob_chunk_tokens": CHUNK,
                            "checkpointing": True},
}
MICRO_ROWS = 4
SMOKE = {"rows": 4, "max_len": 128, "repeats": 1, "preset": "tiny", "models": ["tiny, vocab 32k"],
         "configs": ["plain", "all + checkpointing"]}
"""--smoke: each configuration is a fresh process (~10 s of imports on 2 cores): two of them, on one model."""


def make_models(root: Path, preset: str = "base") -> dict[str, Path]:
    from transformers import LlamaForCausalLM

    from gyre.models.presets import init_model

    base = init_model(preset, root / "base")
    model = LlamaForCausalLM.from_pretrained(base)
    model.config.vocab_size = 32000
    model.resize_token_embeddings(32000)
    big = root / f"{preset}-vocab32k"
    model.save_pretrained(big)
    return {f"{preset} (vocab 100)": base, f"{preset}, vocab 32k": big}


def row_lengths(rows: int, max_len: int) -> tuple[list[int], list[int]]:
    """Prompts of 32-96 tokens and responses of 16 to max_len - 96 tokens, long-tailed (most short)."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(32, 97, (rows,), generator=g).tolist()
    responses = (16 + (max_len - 96 - 16) * torch.rand(rows, generator=g) ** 2).long().tolist()
    return prompts, responses


def make_batch(rows: int, max_len: int, vocab: int):
    import torch

    from gyre.data.batching import collate

    g = torch.Generator().manual_seed(1)
    prompts, responses = ([torch.randint(4, vocab, (n,), generator=g).tolist() for n in lengths]
                          for lengths in row_lengths(rows, max_len))
    batch = collate(prompts, responses, pad_id=0, advantages=torch.randn(rows, generator=g).tolist(),
                    rollout_logprobs=[[-2.0] * len(r) for r in responses])
    batch.old_logprobs = -2.0 * batch.response_mask
    return batch


def _status(key: str) -> int:
    return int(re.search(key + r":\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024


class PeakMemory:
    """Bytes a block adds to the process at its peak."""

    def __init__(self, device):
        self.device, self.added = device, 0

    def __enter__(self):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.before = torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set
            self.before = _status("VmRSS")
        return self

    def __exit__(self, *exc):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.added = torch.cuda.max_memory_allocated() - self.before
        else:
            self.added = _status("VmHWM") - self.before


def measure(model_dir: str, config: dict, rows: int, max_len: int, repeats: int) -> dict:
    """One configuration, in this (fresh) process: train-step and scoring peak bytes and fastest seconds."""
    import torch
    import torch.distributed as dist

    from gyre.algos.aggregation import denominator_for
    from gyre.config.schema import OptimizerConfig, SchedulerConfig
    from gyre.engines.losses import PolicyLoss, PolicyLossSpec
    from gyre.engines.specs import MemoryLevers
    from gyre.engines.trainer import TrainerBackend, TrainerSpec
    from gyre.types import MetricSums

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # On a CPU shared with other work, wall time measures the neighbours: one thread and its CPU time instead.
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    if device.type == "cpu":
        torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    config = dict(config)
    levers = MemoryLevers(**{k: v for k, v in config.items() if k != "checkpointing"})
    spec = TrainerSpec(model_dir, micro_batch_size=MICRO_ROWS, levers=levers,
                       gradient_checkpointing=config.get("checkpointing", False))
    backend = TrainerBackend(spec, device)
    backend.setup()
    backend.configure_optimizer(OptimizerConfig(lr=1e-6), SchedulerConfig(), 100, grad_clip=1.0)
    batch = make_batch(rows, max_len, backend.hf_model.config.vocab_size)
    loss = PolicyLoss(denominator_for(batch.response_mask), PolicyLossSpec(old_source="recomputed"))
    out = {"tokens": int(batch.attention_mask.sum()), "padded": int(batch.attention_mask.numel()),
           "micro_batches": len(backend.split_micro(batch))}
    for name, run in (("train", lambda: backend.optimizer_step(backend.split_micro(batch), loss, MetricSums())),
                      ("score", lambda: backend.compute_logprobs(batch, 1.0))):
        run()  # warm-up: the optimizer state and the allocator's first blocks
        seconds, peaks = [], []
        for _ in range(repeats):
            backend.optimizer.zero_grad(set_to_none=True)
            with PeakMemory(device) as peak:
                start = clock()
                run()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                seconds.append(clock() - start)
            peaks.append(peak.added)
        out[f"{name}_s"], out[f"{name}_bytes"] = min(seconds), max(peaks)
    dist.destroy_process_group()
    return out


def run_config(model_dir: Path, config: dict, args) -> dict:
    tokens = sum(map(sum, row_lengths(args.rows, args.max_len)))
    config = {k: -(-MICRO_ROWS * tokens // args.rows) if v == BUDGET else v for k, v in config.items()}
    cmd = [sys.executable, __file__, "--child", json.dumps({"model": str(model_dir), "config": config}),
           "--rows", str(args.rows), "--max-len", str(args.max_len), "--repeats", str(args.repeats)]
    # A fixed mmap threshold: glibc then maps every block of 64 KiB or more on its own and unmaps it when
    # freed, so the resident set follows the live tensors (its default threshold grows as blocks are
    # freed, after which freed memory stays resident and reused memory never shows in the peak).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"configuration {config} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(name: str, results: dict[str, dict]) -> None:
    plain = results["plain"]
    first = next(iter(results.values()))
    print(f"\n{name}: {first['tokens']} real tokens in {first['padded']} padded positions; plain: "
          f"{MICRO_ROWS} rows per micro-batch; token budget {MICRO_ROWS} average rows; chunks of {CHUNK} tokens")
    print(f"{'configuration':<24}{'micro':>6}{'train MiB':>11}{'x plain':>9}{'train s':>9}{'x plain':>9}"
          f"{'score MiB':>11}{'x plain':>9}{'score s':>9}{'x plain':>9}")
    for label, r in results.items():
        cells = []
        for phase in ("train", "score"):
            cells += [f"{r[f'{phase}_bytes'] / 2**20:>11.0f}", f"{r[f'{phase}_bytes'] / plain[f'{phase}_bytes']:>9.2f}",
                      f"{r[f'{phase}_s']:>9.2f}", f"{r[f'{phase}_s'] / plain[f'{phase}_s']:>9.2f}"]
        print(f"{label:<24}{r['micro_batches']:>6}" + "".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--max-len", type=int, default=320)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    vars(args).update(SMOKE if args.smoke else {"preset": "base", "models": None, "configs": list(CONFIGS)})
    if args.child:
        job = json.loads(args.child)
        print(json.dumps(measure(job["model"], job["config"], args.rows, args.max_len, args.repeats)))
        return
    import torch

    where = ("GPU (torch.cuda.max_memory_allocated, wall seconds)" if torch.cuda.is_available()
             else "CPU (peak RSS added, CPU seconds of 1 thread)")
    print(f"memory levers: one policy train step and one scoring pass, {args.rows} rows of <= {args.max_len} "
          f"tokens, fp32, {where}; fastest of {args.repeats}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, model_dir in make_models(Path(tmp), args.preset).items():
            if args.models is None or name in args.models:
                report(name, {label: run_config(model_dir, CONFIGS[label], args) for label in args.configs})


if __name__ == "__main__":
    main()
