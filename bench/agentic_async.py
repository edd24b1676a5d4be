"""Environment-level asynchrony against turn-synchronised batching, with and without redundancy, on
environments whose step latency varies, in one run.

The environment (``gyre.envs.latency.LatencyEnv``) lasts ``--turns`` model turns; each step sleeps a
lognormal latency whose standard deviation equals its mean, seeded by the episode and its action. A first
run with (almost) no latency measures the decode time of one turn (the whole batch of episodes sampling
a turn together, turn-synchronised); the environments' mean latency is then ``--factor`` times that.

Schedules, each trained for the same steps and seed from the same tiny model:
- ``turn-sync``: every episode's next turn waits for every environment, every environment for every turn
  (the classic loop: the baseline);
- ``env-async``: each episode asks for its next turn as soon as its own environment answers;
- ``+redundancy``: ``--extra`` more episodes per group, the first ``samples`` to finish are kept.

The table gives kept episodes per second of rollout (episodes trained per step / the step's rollout
time) and seconds per training step, each with its speed-up over ``turn-sync`` (higher is faster), and
the environment steps each training step paid for (redundancy's cost). The first step (environment
processes start, engines warm up) is left out; a JSON file holds every run's per-step numbers.

``--smoke``: the smallest run of the same path: env-async+redundancy, 2 steps of 2 groups x 2 (+1 redundant)
episodes of 2 turns, with the decode time taken as 0.05 s instead of measured (the calibration is one more
run of the same function); the other schedules are planned (config and placement checked), not trained.

    python bench/agentic_async.py [--steps 4] [--turns 5] [--factor 4] [--groups 8] [--samples 4] [--only env-async]
                                  [--out DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

GROUPS, SAMPLES = 8, 4
COMMON = ["cluster.cpu_slots=2", "rollout.mode=hybrid", "rollout.devices=[0,1]", "policy.devices=[0,1]",
          "policy.micro_batch_size=48", "policy.optimizer.lr=1e-4", "env.id=gyre.envs.latency:LatencyEnv",
          "env.turn_tokens=16", "env.context_tokens=320", "env.workers=2", "env.val_episodes=1",
          "logging.progress=false", "logging.trackers=[]", "logging.plot=false", "checkpoint.every=0"]
SCHEDULES: dict[str, list[str]] = {
    "turn-sync": ["env.turn_sync=true"],
    "turn-sync+redundancy": ["env.turn_sync=true", "env.extra_samples={extra}"],
    "env-async": [],
    "env-async+redundancy": ["env.extra_samples={extra}"],
}
BASELINE = "turn-sync"
STEP_KEYS = ("step", "time/step", "time/generate", "time/train", "env/steps", "reward/mean", "response_length/mean")
"""Kept per step in the JSON; the last two also tell whether two schedules trained on the same episodes."""
DEFAULT = ["turn-sync", "env-async", "env-async+redundancy"]
"""Run by default (3-6 minutes on 2 CPU cores). Under turn-sync every episode of a group ends at the
same barrier, so redundancy there only adds work: ask for it with --only."""
SMOKE = {"steps": 2, "turns": 2, "groups": 2, "samples": 2, "extra": 1, "only": ["env-async+redundancy"],
         "trials": 200, "decode_s": 0.05}
"""--smoke: every run starts its own workers and a process per environment slot (one per episode), so one
schedule trains, the one with the most machinery (async, redundancy), on 2 groups of 2 (+1) episodes."""


def env_slots(name: str, args) -> int:
    """Per environment worker: every episode of a step has an environment (they are the bottleneck)."""
    return -(-args.groups * (args.samples + (args.extra if "redundancy" in name else 0)) // 2)


def schedule_config(name: str, model: str, out: Path, args, mean_s: float, cv: float):
    from gyre.config import load_config

    extra = [o.format(extra=args.extra) for o in SCHEDULES[name]]
    slots = env_slots(name, args)
    return load_config(None, [
        f"run.output_dir={out}", f"run.steps={args.steps}", f"run.seed={args.seed}", f"model.path={model}",
        f"env.kwargs={{turns: {args.turns}, mean_s: {mean_s:.6f}, cv: {cv}}}", f"env.max_turns={args.turns}",
        f"env.slots_per_worker={slots}", f"env.step_timeout_s={max(30.0, 40 * mean_s):.0f}",
        f"rollout.prompts_per_step={args.groups}", f"rollout.samples_per_prompt={args.samples}", *COMMON, *extra])


def run(name: str, model: str, out: Path, args, mean_s: float, cv: float) -> dict:
    """Train ``args.steps`` steps under schedule ``name``; the timed steps' numbers."""
    from gyre.app import launch

    t0 = time.perf_counter()
    launch.train(schedule_config(name, model, out, args, mean_s, cv), echo=lambda s: None)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if r.get("step", 0) > 1 and "time/step" in r]
    generate = [r["time/generate"] for r in timed]
    episodes = args.groups * args.samples
    return {"schedule": name, "wall_s": wall, "episodes_per_step": episodes, "slots": 2 * env_slots(name, args),
            "episodes_per_s": episodes * len(timed) / sum(generate),
            "s_per_step": statistics.mean(r["time/step"] for r in timed), "generate_s": statistics.mean(generate),
            "train_s": statistics.mean(r["time/train"] for r in timed),
            "env_steps_per_step": statistics.mean(r.get("env/steps", 0) for r in timed),
            "env_failures": sum(v for r in timed for k, v in r.items() if k.startswith("env/failures")),
            "steps": [{k: r[k] for k in STEP_KEYS if k in r} for r in timed]}


def decode_time(model: str, tmp: Path, args) -> float:
    """Seconds one turn of the whole batch takes to sample (turn-synchronised, environments answering at once)."""
    r = run(BASELINE, model, tmp / "calibrate", argparse.Namespace(**{**vars(args), "steps": 3}), 1e-4, 0.0)
    return r["generate_s"] / args.turns


def main() -> None:
    from gyre.models.presets import init_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4, help="training steps per schedule (the first is not timed)")
    ap.add_argument("--turns", type=int, default=5, help="model turns per episode")
    ap.add_argument("--factor", type=float, default=4.0, help="mean environment latency / decode time of a turn")
    ap.add_argument("--cv", type=float, default=1.0, help="standard deviation / mean of the latency")
    ap.add_argument("--extra", type=int, default=2, help="redundant episodes per group (env.extra_samples)")
    ap.add_argument("--groups", type=int, default=GROUPS, help="environment seeds (groups) per step")
    ap.add_argument("--samples", type=int, default=SAMPLES, help="episodes trained per group")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="+", choices=list(SCHEDULES), default=DEFAULT)
    ap.add_argument("--out", default=None, help="keep the runs and results.json here")
    ap.add_argument("--trials", type=int, default=2000, help="Monte Carlo trials of the expected speed-ups")
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    from gyre.app.preflight import preflight
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(args.out or tmp_dir)
        tmp.mkdir(parents=True, exist_ok=True)
        model = str(init_model("tiny", tmp / "model"))
        for name in SCHEDULES:
            if args.smoke and name not in args.only:  # planned (config, placement), not trained
                preflight(schedule_config(name, model, tmp / "plan", args, 0.01, args.cv), None)
        decode = args.decode_s if args.smoke else decode_time(model, tmp, args)
        mean_s = args.factor * decode
        how = "fixed by --smoke" if args.smoke else "turn-synchronised"
        print(f"decode time of one turn ({args.groups * args.samples} episodes, {args.turns} turns, {how}): "
              f"{decode:.3f} s; environment step latency: lognormal, mean {mean_s:.3f} s "
              f"({args.factor:g}x), std {args.cv * mean_s:.3f} s", flush=True)
        results = []
        for name in args.only:
            results.append(run(name, model, tmp / name, args, mean_s, args.cv))
            r = results[-1]
            print(f"  {name:<22} {r['episodes_per_s']:.2f} episodes/s, {r['s_per_step']:.2f} s/step "
                  f"({r['wall_s']:.0f} s in all)", flush=True)
        ideal = expected_speedups(args)
        summary = {"decode_s_per_turn": decode, "latency_mean_s": mean_s, "latency_std_s": args.cv * mean_s,
                   "expected_speedups": ideal, "args": vars(args), "runs": results}
        (tmp / "results.json").write_text(json.dumps(summary, indent=1))
        report(results)
        paired(results)
        print(f"expected from the latencies alone (each turn's decode {1 / args.factor:g} of the mean latency, no "
              f"contention): env-async {ideal['env-async']:.2f}x, env-async+redundancy "
              f"{ideal['env-async+redundancy']:.2f}x")


def expected_speedups(args) -> dict[str, float]:
    """What the schedules would gain if only the latencies mattered (Monte Carlo, in units of the mean
    latency): a turn-synchronised step waits for the slowest environment at every turn, an asynchronous
    one for the slowest episode, a redundant one for the G-th fastest episode of its slowest group."""
    import random

    from gyre.envs.latency import lognormal_params

    mu, sigma = lognormal_params(1.0, args.cv)
    groups, samples = args.groups, args.samples
    rng, decode, size = random.Random(0), 1 / args.factor, samples + args.extra
    sync, free, spare = [], [], []
    for _ in range(args.trials):
        lat = [[rng.lognormvariate(mu, sigma) for _ in range(args.turns)] for _ in range(groups * size)]
        episode = [sum(row) + args.turns * decode for row in lat]
        kept = [i for i in range(groups * size) if i % size < samples]
        sync.append(sum(max(lat[i][t] for i in kept) + decode for t in range(args.turns)))
        free.append(max(episode[i] for i in kept))
        spare.append(max(sorted(episode[g * size:(g + 1) * size])[samples - 1] for g in range(groups)))
    return {"env-async": sum(sync) / sum(free), "env-async+redundancy": sum(sync) / sum(spare)}


def paired(results: list[dict]) -> None:
    """Without redundancy every schedule trains the same episodes (the same seeds, so the same actions,
    so the same latencies): say whether they did, which makes the comparison paired."""
    same = [r["schedule"] for r in results if "redundancy" not in r["schedule"]]
    if len(same) > 1:
        fingerprint = {name: [(s.get("reward/mean"), s.get("response_length/mean"))
                              for s in next(r for r in results if r["schedule"] == name)["steps"]] for name in same}
        verdict = "the same" if len({json.dumps(f) for f in fingerprint.values()}) == 1 else "different"
        print(f"{' and '.join(same)} trained on {verdict} episodes (rewards and lengths of every step)")


def report(results: list[dict]) -> None:
    base = next((r for r in results if r["schedule"] == BASELINE), None)
    print(f"\n{'schedule':<24}{'episodes/s':>11}{'speed-up':>10}{'s/step':>9}{'speed-up':>10}"
          f"{'rollout s':>11}{'train s':>9}{'env steps':>11}")
    for r in results:
        speed = f"{r['episodes_per_s'] / base['episodes_per_s']:.2f}x" if base else "-"
        step = f"{base['s_per_step'] / r['s_per_step']:.2f}x" if base else "-"
        print(f"{r['schedule']:<24}{r['episodes_per_s']:>11.2f}{speed:>10}{r['s_per_step']:>9.2f}{step:>10}"
              f"{r['generate_s']:>11.2f}{r['train_s']:>9.2f}{r['env_steps_per_step']:>11.0f}")


if __name__ == "__main__":
    main()
