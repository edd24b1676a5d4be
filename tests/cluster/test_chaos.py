"""The drill's run comparison (which metric differences count as a different run) and its schedule."""
import json
import subprocess
import sys

import yaml

from gyre.cluster.chaos import Fault, fault_steps, plan_faults, read_stream


def write_stream(run_dir, records):
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_stream_keeps_outcomes_and_drops_what_timing_and_faults_decide(tmp_path):
    write_stream(tmp_path / "run", [{
        "step": 3, "reward/mean": 0.5, "rollout/groups_filtered": 2,
        "time/step": 1.2, "idle/rollout": 0.1, "fault/engine_deaths": 1, "rollout/samples_requeued": 16,
        "rollout/in_flight_groups": 4, "rollout/buffer_groups": 1, "reward/latency": 0.3,
    }])
    assert read_stream(tmp_path / "run") == [{"step": 3, "reward/mean": 0.5, "rollout/groups_filtered": 2}]


def test_planned_faults_cycle_over_targets_and_only_kill_the_driver():
    faults = plan_faults(11, seed=0)
    assert len(faults) == 11 and {f.target for f in faults} >= {"policy", "rollout", "driver"}
    assert all(f.action == "kill" for f in faults if f.target == "driver")
    assert faults == plan_faults(11, seed=0) and faults != plan_faults(11, seed=1)


def test_fault_steps_spread_over_the_run_and_leave_a_step_to_strike_in():
    steps = fault_steps(6, 40, seed=2)
    assert steps == sorted(steps) and 1 <= steps[0] and steps[-1] <= 38
    assert all(i * 38 // 6 < s <= (i + 1) * 38 // 6 for i, s in enumerate(steps))  # one in each sixth
    assert steps == fault_steps(6, 40, seed=2) and steps != fault_steps(6, 40, seed=3)
    many = fault_steps(20, 8, seed=0)  # more faults than steps: several after one step, none past 6
    assert len(many) == 20 and many == sorted(many) and 1 <= many[0] and many[-1] <= 6


FAKE_RUN = """
import json, pathlib, sys, time
import yaml
run = yaml.safe_load(open(sys.argv[1]))["run"]
metrics = pathlib.Path(run["output_dir"]) / "metrics.jsonl"
metrics.parent.mkdir(exist_ok=True)
lines = metrics.read_text().splitlines() if metrics.exists() else []
done = json.loads(lines[-1])["step"] if lines else 0  # a resumed driver goes on where it was killed
with metrics.open("a") as f:
    for step in range(done + 1, run["steps"] + 1):
        t0 = time.time()
        time.sleep(run["step_s"])
        f.write(json.dumps({"step": step, "time": round(time.time(), 3), "time/step": time.time() - t0}) + "\\n")
        f.flush()
"""


def test_a_drill_strikes_on_the_runs_steps_however_fast_it_runs(tmp_path, monkeypatch):
    """A run of 20 steps of 0.15 s (3 s in all; a wall-clock gap of 0.5-3 s per fault would outlive it)
    and 4 driver kills: every fault lands, each after its scheduled step, and the run finishes."""
    from gyre.cluster import chaos

    script = tmp_path / "fake_run.py"
    script.write_text(FAKE_RUN)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"run": {"output_dir": str(tmp_path / "run"), "steps": 20, "step_s": 0.15}}))

    def start(config, log, resume):
        return subprocess.Popen([sys.executable, str(script), str(config)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    monkeypatch.setattr(chaos, "_start", start)
    report = chaos.run_drill(config, [Fault("driver", "kill")] * 4, seed=5, timeout_s=60)
    assert len(report.injected) == 4 and report.driver_starts == 5, report
    assert report.schedule == fault_steps(4, 20, seed=5)
    assert all(done >= planned for done, planned in zip(report.struck_after, report.schedule)), report
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 21))
