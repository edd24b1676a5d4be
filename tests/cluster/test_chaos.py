"""The drill's run comparison: which metric differences count as a different run."""
import json

from gyre.cluster.chaos import plan_faults, read_stream


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
