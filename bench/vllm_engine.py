"""Generation throughput of gyre's rollout engines on the same requests: HF, vLLM eager, vLLM compiled.

Every engine decodes the same requests (prompts from the arithmetic task, ``--samples`` per prompt,
exactly ``--tokens`` new tokens each: ``ignore_eos``, so all decode the same token count) in the same
process, one engine at a time, in alternating rounds (machine speed drifts by tens of percent over
minutes on these machines). Reported: the median decode tokens per second of each engine over its rounds,
the ratio to the HF engine, and each engine's start-up seconds (vLLM's compiled mode buys decode speed
with a much longer start: ``rollout.enforce_eager``, docs/guides/engines.md).

Threads: each engine gets ``--threads`` (vLLM's OpenMP threads unbound, as gyre's rollout worker sets them).
Without vLLM installed (gyre's main environment) the HF engine alone is measured and the vLLM engines are
named as skipped; ``make test-vllm`` runs the ``--smoke`` size with vLLM.

    python bench/vllm_engine.py [--preset small | --model DIR] [--prompts 16] [--samples 8] [--tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path

SMOKE = {"preset": "tiny", "prompts": 2, "samples": 4, "tokens": 8, "rounds": 1, "compiled": False}
"""--smoke: the same path at the smallest size; compiled mode (minutes of start-up here) is left out."""


def build(kind: str, model: str, tokenizer, threads: int, max_len: int):
    """An engine of ``kind`` and its start-up seconds."""
    import torch

    start = time.perf_counter()
    if kind == "hf":
        from gyre.engines.hf_rollout import HFRolloutEngine
        from gyre.models.loading import load_causal_lm

        torch.set_num_threads(threads)
        engine = HFRolloutEngine(load_causal_lm(model), tokenizer)
    else:
        from gyre.engines.vllm_rollout import VLLMRolloutEngine

        engine = VLLMRolloutEngine(model, tokenizer, max_model_len=max_len, max_batch_size=256,
                                   enforce_eager=kind == "vllm-eager")
    return engine, time.perf_counter() - start


def requests(tokenizer, prompts: list[str], samples: int, tokens: int, round_: int):
    from gyre.types import GenerationRequest, SamplingParams

    params = SamplingParams(temperature=1.0, max_new_tokens=tokens, ignore_eos=True)
    return [GenerationRequest(f"r{round_}-{i}", tokenizer(p)["input_ids"], params, n=samples, seed=round_ * 1000 + i)
            for i, p in enumerate(prompts)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="small")
    ap.add_argument("--model", help="a Hugging Face model directory to measure instead of a preset's random model")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-compiled", dest="compiled", action="store_false", help="leave out vLLM's compiled mode")
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    # What gyre's rollout worker sets for a vLLM engine (gyre/cluster/workers.py): threads unbound, counted.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from gyre.models.loading import load_tokenizer
    from gyre.models.presets import init_model
    from gyre.tasks.arithmetic import write_arithmetic_task

    kinds = ["hf"]
    if importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed: the vLLM engines are skipped (make setup-vllm; "
              ".venv-vllm/bin/python bench/vllm_engine.py)")
    else:
        kinds += ["vllm-eager"] + (["vllm-compiled"] if args.compiled else [])
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        model = args.model or str(init_model(args.preset, tmp / "model"))
        tok = load_tokenizer(model)
        import json

        rows = [json.loads(line) for line in (write_arithmetic_task(tmp / "data")["train"]).read_text().splitlines()]
        prompts = [r["prompt"] for r in rows[: args.prompts]]
        max_len = max(len(tok(p)["input_ids"]) for p in prompts) + args.tokens + 8
        engines, start_s = {}, {}
        for kind in kinds:
            engines[kind], start_s[kind] = build(kind, model, tok, args.threads, max_len)
        total = args.prompts * args.samples * args.tokens
        print(f"model {args.model or 'preset ' + args.preset}; {args.prompts} prompts x {args.samples} samples x "
              f"{args.tokens} tokens "
              f"({total} tokens per round), fp32, {args.threads} threads")
        rate: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds + 1):  # round 0 warms every engine up (first-call costs), not counted
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                t0 = time.perf_counter()
                out = engines[kind].generate(requests(tok, prompts, args.samples, args.tokens, r))
                seconds = time.perf_counter() - t0
                assert sum(len(x.response_ids) for x in out) == total, kind
                if r:
                    rate[kind].append(total / seconds)
                    print(f"  round {r}: {kind:<13} {total / seconds:8.0f} tokens/s", flush=True)
        if not args.rounds:
            return
        hf = statistics.median(rate["hf"])
        for kind in kinds:
            median = statistics.median(rate[kind])
            print(f"{kind:<13} median {median:8.0f} tokens/s  {median / hf:5.2f}x the HF engine  "
                  f"start-up {start_s[kind]:6.1f} s")


if __name__ == "__main__":
    main()
