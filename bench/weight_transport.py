"""Weight sync from the policy to the rollout engines: the weight channel against the object store, side by side.

One real run's roles (a policy rank and a rollout engine, Ray actors each on a CPU core of its own, as each
would have its GPU; built by ``gyre.cluster.roles.build_roles``) publish the policy's weights as the
pipeline does: the learner exports (object store: gather, pack, ``ray.put``; channel: stage buckets on the
policy's device) and the rollout driver loads the version into the engine (object store: ``ray.get``,
checksum, copy; channel: a broadcast from the policy's rank 0, checked per bucket, large tensors received
straight into the engine's weights). The two paths alternate within each round on the same actors
(machine speed drifts over minutes), at three model sizes; reported: the median seconds of one whole
sync (export + load), and the weight bytes the engine receives per second of it (model.dtype float32:
the bytes of the checkpoint). This machine has two cores, so one engine: a third process would share a
core and time the contention, not the transfer.

``--smoke``: the smallest run of the same path: the tiny preset, one round.

    python bench/weight_transport.py [--sizes small base large] [--rounds 7] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

SIZES = {"tiny": (128, 2, 4), "small": (256, 4, 4), "base": (512, 8, 8), "large": (1024, 8, 16)}
"""Model shapes (hidden size, layers, heads) of the gyre presets, and a larger one built the same way."""
SMOKE = {"sizes": ["tiny"], "rounds": 1}
PATHS = ("object_store", "channel")


def build_model(name: str, out: Path) -> str:
    """A random Llama-style model of shape ``SIZES[name]`` (gyre's character tokenizer), saved to ``out``."""
    from gyre.models import presets

    hidden, layers, heads = SIZES[name]
    presets.PRESETS.setdefault(name, presets.ModelPreset(hidden_size=hidden, num_layers=layers, num_heads=heads))
    return str(presets.init_model(name, out / name))


def measure(model: str, rounds: int) -> dict[str, list[float]]:
    """Seconds of each sync, by path, alternating paths within each round."""
    from gyre.cluster.roles import build_roles
    from gyre.cluster.runtime import start_ray
    from gyre.config import load_config, make_plan
    from gyre.rollout.driver import RolloutDriver
    from gyre.training.learner import Learner

    cfg = load_config(None, [f"model.path={model}", "data.train_files=[unused.jsonl]", "cluster.cpu_slots=2",
                             "policy.devices=[0]", "rollout.devices=[1]", "rollout.weight_transport=channel",
                             "model.dtype=float32", "logging.trackers=[]"])
    plan = make_plan(cfg, "cpu", 2)
    start_ray(cfg, "cpu", 2, None, 0)
    roles = build_roles(cfg, plan)
    try:
        learner = Learner(cfg, plan, roles)
        driver = RolloutDriver(roles.rollout, rewards=None)
        channel, times = learner.channel, {p: [] for p in PATHS}
        version = 0
        for round_ in range(rounds + 1):  # round 0 warms both paths up (the channel builds its group)
            for path in PATHS:
                version += 1
                learner.channel = channel if path == "channel" else None
                t0 = time.perf_counter()
                driver.load_weights(version, learner.export(version), partial=True)
                if round_:
                    times[path].append(time.perf_counter() - t0)
        assert driver.channel_fallbacks == 0, "a channel transfer fell back to the object store"
        return times
    finally:
        roles.kill()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["small", "base", "large"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="the smallest run of the same path (SMOKE)")
    args = ap.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    import ray

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            model = build_model(size, Path(tmp))
            nbytes = sum(p.stat().st_size for p in Path(model).glob("*.safetensors"))
            times = measure(model, args.rounds)
            ray.shutdown()
            med = {p: statistics.median(t) for p, t in times.items()}
            rows.append((size, nbytes, med))
            print(f"  {size}: {nbytes / 1e6:.1f} MB, object store {med['object_store']:.3f} s, "
                  f"channel {med['channel']:.3f} s", flush=True)
    print(f"\n{'model':<8}{'MB':>8}{'object store s':>16}{'MB/s':>9}{'channel s':>11}{'MB/s':>9}"
          f"{'channel vs store':>18}")
    for size, nbytes, med in rows:
        store, chan = med["object_store"], med["channel"]
        print(f"{size:<8}{nbytes / 1e6:>8.1f}{store:>16.3f}{nbytes / 1e6 / store:>9.0f}{chan:>11.3f}"
              f"{nbytes / 1e6 / chan:>9.0f}{store / chan:>17.2f}x")


if __name__ == "__main__":
    main()
