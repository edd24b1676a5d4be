"""Reward throughput of the sandboxed code reward: a fixed timeout vs RollPacker's adaptive timeout.

Each round scores the same kind of batch: per problem, 40% fast correct programs, 20% slow correct ones
(~0.3 s of work per test), 20% wrong ones and 20% that never terminate, through a spawn pool of 2
worker processes (as the reward runner does). Constants are scaled down so the run takes about a
minute: T_max 3 s, T_min 0.2 s, lam 1.5. The fixed policy gives every test run T_max. The adaptive
one (RollPacker, arXiv 2509.21009) starts at T_max too and, after each round, observes the results, so
from the second round a case's timeout is ~lam x its slowest correct run. Prints samples per second
for each, their ratio, and how many correct programs each scored: adaptive must not turn slow-but-
correct programs into timeouts.

``--smoke``: the same rounds at the smallest size: 2 rounds (the adaptive timeout adapts from the second)
of one problem's 5 programs, T_max 1 s.

    python bench/code_sandbox.py [--rounds 3] [--problems 4] [--per-problem 5] [--workers 2] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import time

FAST = "xs = list(map(int, input().split()))\nprint(sum(xs) * {m})"
SLOW = "import time\nstart = time.perf_counter()\nwhile time.perf_counter() - start < 0.3:\n    pass\n" + FAST
WRONG = "xs = list(map(int, input().split()))\nprint(sum(xs) * {m} + 1)"
LOOP = "while True:\n    pass"
MIX = (("fast", FAST, 0.4), ("slow", SLOW, 0.2), ("wrong", WRONG, 0.2), ("loop", LOOP, 0.2))
SMOKE = {"rounds": 2, "problems": 1, "per_problem": 5, "t_max": 1.0}


def make_batch(problems: int, per_problem: int, seed: int) -> list[tuple[str, str, str, str]]:
    """(kind, case key, response, ground truth) for one round, shuffled."""
    batch = []
    for p in range(problems):
        m = p + 2
        inputs = ["1 2 3\n", "10 20 30 40\n"]
        gt = json.dumps({"inputs": inputs, "outputs": [f"{sum(map(int, s.split())) * m}\n" for s in inputs]})
        for kind, template, share in MIX:
            for _ in range(round(share * per_problem)):
                batch.append((kind, f"problem-{p}", f"```python\n{template.format(m=m)}\n```", gt))
    random.Random(seed).shuffle(batch)
    return batch


def _warm(_=None) -> None:
    """Import the reward (gyre.types pulls in torch) and probe the sandbox layers, outside the timed part."""
    from gyre.rewards.code import code_reward  # noqa: F401
    from gyre.rewards.sandbox import sandbox_capabilities

    sandbox_capabilities()


def _score(task: tuple[str, str, dict]) -> dict:
    from gyre.rewards.code import code_reward

    response, gt, kwargs = task
    result = code_reward(response, gt, **kwargs)
    return {"score": result.score, "correct": result.correct, "status": result.status, "info": result.info}


def run_policy(pool, batches, adaptive, t_max: float) -> dict:
    """Score every round's batch; with ``adaptive`` (an AdaptiveTimeout), observe each round's results."""
    from gyre.types import RewardResult

    seconds, correct, lost, per_round = 0.0, 0, 0, []
    for batch in batches:
        state = adaptive.to_dict() if adaptive is not None else None
        tasks = [(resp, gt, {"case_key": key, "adaptive": state} if state else {"timeout_s": t_max})
                 for _, key, resp, gt in batch]
        start = time.monotonic()
        results = pool.map(_score, tasks, chunksize=1)
        per_round.append(time.monotonic() - start)
        for (kind, key, _, _), res in zip(batch, results):
            correct += bool(res["correct"])
            lost += kind in ("fast", "slow") and not res["correct"]
            if adaptive is not None:
                adaptive.observe(key, RewardResult(res["score"], res["correct"], res["status"], info=res["info"]))
    seconds = sum(per_round)
    samples = sum(len(b) for b in batches)
    return {"seconds": seconds, "samples": samples, "rate": samples / seconds, "correct": correct, "lost": lost,
            "rounds": per_round}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--problems", type=int, default=4)
    ap.add_argument("--per-problem", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--t-min", type=float, default=0.2)
    ap.add_argument("--t-max", type=float, default=3.0)
    ap.add_argument("--lam", type=float, default=1.5)
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    from gyre.rewards.code import AdaptiveTimeout
    from gyre.rewards.sandbox import sandbox_capabilities

    batches = [make_batch(args.problems, args.per_problem, seed) for seed in range(args.rounds)]
    expected = sum(kind in ("fast", "slow") for b in batches for kind, *_ in b)
    layers = [k for k, v in sandbox_capabilities().items() if v is True]
    print(f"sandbox layers: {', '.join(layers)}")
    print(f"{args.rounds} rounds x {len(batches[0])} samples ({args.problems} problems: 40% fast, 20% slow ~0.3 s, "
          f"20% wrong, 20% infinite loop), {args.workers} workers; T_max {args.t_max} s, T_min {args.t_min} s, "
          f"lam {args.lam}; {expected} correct programs in all")
    with mp.get_context("spawn").Pool(args.workers, initializer=_warm) as pool:
        pool.map(_warm, range(args.workers))  # workers started and probed before any timing
        fixed = run_policy(pool, batches, None, args.t_max)
        adaptive = AdaptiveTimeout(args.t_min, args.t_max, args.lam)
        adapt = run_policy(pool, batches, adaptive, args.t_max)
    print(f"{'policy':<10}{'seconds':>9}{'samples/s':>11}{'correct':>9}{'lost':>6}   seconds per round")
    for name, r in (("fixed", fixed), ("adaptive", adapt)):
        rounds = " ".join(f"{s:.2f}" for s in r["rounds"])
        print(f"{name:<10}{r['seconds']:>9.2f}{r['rate']:>11.2f}{r['correct']:>9}{r['lost']:>6}   {rounds}")
    timeouts = {k: round(adaptive.timeout_for(k), 3) for k in sorted(adaptive.anchors)}
    print(f"adaptive / fixed throughput: {adapt['rate'] / fixed['rate']:.2f}x; final adaptive timeouts: {timeouts}")
    print(f"slow-but-correct programs turned into failures by the adaptive timeout: {adapt['lost'] - fixed['lost']}")


if __name__ == "__main__":
    main()
