"""The cost of attention-based credit's extra pass, side by side with the log-prob pass it joins.

Per step, attention credit (``algorithm.credit.strategy`` local_chunk / global_anchor / coupled) runs one
more no-grad forward of the policy with eager attention, keeping the maps of the middle-third layers
(``gyre.engines.attention``). This times, on the same batch and model through gyre's TrainerBackend:
the log-prob pass the run makes anyway (the model's default kernel, sdpa), the credit pass, and the
entropy baseline's pass (the same forward without the maps). Times are the fastest of the repeats,
CPU seconds of the process (a shared machine inflates wall time, not the work), or wall seconds on a GPU.

``--smoke``: the same passes at the smallest size (the `tiny` preset, 2 rows of up to 8+16 tokens, once).

    python bench/attention_credit.py [--preset small] [--rows 8] [--prompt 64] [--response 192] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

SMOKE = {"preset": "tiny", "rows": 2, "prompt": 8, "response": 16, "micro_batch": 2, "repeats": 1}


def _batch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0):
    from gyre.types import TrainBatch

    g = torch.Generator().manual_seed(seed)
    length = prompt + response
    ids = torch.randint(4, vocab, (rows, length), generator=g)
    attention = torch.ones(rows, length, dtype=torch.long)
    resp = torch.zeros(rows, length)
    resp[:, prompt:] = 1
    for r in range(rows):  # rows of different lengths, right-padded, as RL batches are
        end = length - r * response // (2 * rows)
        attention[r, end:] = 0
        resp[r, end:] = 0
    return TrainBatch(ids, attention, resp, torch.zeros(rows, length), torch.zeros(rows, length))


def _timed(fn, repeats: int) -> float:
    cuda = torch.cuda.is_available()
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter() if cuda else time.process_time()
        fn()
        if cuda:
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() if cuda else time.process_time()) - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small", help="a gyre model preset (tiny, small, base)")
    for name, default in (("rows", 8), ("prompt", 64), ("response", 192), ("micro-batch", 4), ("repeats", 3)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = p.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)

    import torch.distributed as dist

    from gyre.algos.attention_credit import CreditSpec
    from gyre.engines.trainer import TrainerBackend, TrainerSpec
    from gyre.models.presets import init_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    with tempfile.TemporaryDirectory() as tmp:
        path = init_model(args.preset, f"{tmp}/model", seed=0)
        backend = TrainerBackend(TrainerSpec(model_path=str(path), micro_batch_size=args.micro_batch,
                                             attn_implementation="sdpa"), device)
        backend.setup()
        batch = _batch(args.rows, args.prompt, args.response, backend.hf_model.config.vocab_size)
        runs = {
            "log-probs (sdpa)": lambda: backend.compute_logprobs(batch, 1.0),
            "credit: entropy (eager, no maps)": lambda: backend.compute_credit_scales(
                batch, CreditSpec(strategy="entropy"), 1.0),
            "credit: coupled (eager + 5 layers' maps)": lambda: backend.compute_credit_scales(
                batch, CreditSpec(strategy="coupled"), 1.0),
        }
        times = {name: _timed(fn, args.repeats) for name, fn in runs.items()}
    dist.destroy_process_group()
    layers = backend.hf_model.config.num_hidden_layers
    unit = "wall s" if device.type == "cuda" else "CPU s"
    print(f"{args.preset} model ({layers} layers), {args.rows} rows of up to {args.prompt}+{args.response} tokens, "
          f"micro-batches of {args.micro_batch}, {device.type}; fastest of {args.repeats}")
    base = times["log-probs (sdpa)"]
    for name, t in times.items():
        print(f"  {name:<42} {t:8.3f} {unit}   x{t / base:.2f} of the log-prob pass")


if __name__ == "__main__":
    main()
