"""The workload model: draws keyed by identity, long tails, and fitting lengths from a real run's metrics."""

import json
import math
import statistics

import pytest

from gyre.sim.workload import Workload, WorkloadSpec, fit_lengths, lognormal


def test_draws_depend_on_the_sample_not_on_the_order_they_are_asked_for():
    w = Workload(WorkloadSpec(), seed=3)
    prompts = [w.prompt(i) for i in range(5)]
    forward = [w.response_tokens(p, s) for p in prompts for s in range(4)]
    backward = [w.response_tokens(p, s) for p in reversed(prompts) for s in reversed(range(4))]
    assert forward == list(reversed(backward))
    assert Workload(WorkloadSpec(), seed=4).response_tokens(prompts[0], 0) != forward[0]


def test_lengths_are_long_tailed_with_the_mean_asked_for_and_hard_prompts_long_together():
    w = Workload(WorkloadSpec(response_tokens=1000, length_sigma=0.9, prompt_share=0.6), seed=0)
    prompts = [w.prompt(i) for i in range(400)]
    lengths = [[w.response_tokens(p, s) for s in range(8)] for p in prompts]
    flat = [x for group in lengths for x in group]
    assert statistics.mean(flat) == pytest.approx(1000, rel=0.08)
    assert max(flat) > 10 * statistics.median(flat)  # the tail
    # 60 % of the log-variance (0.81) is the prompt's: the group means vary by 0.49 + 0.32 / 8 = 0.53, the
    # samples within a group by 0.32 x 7 / 8 = 0.28 (noise alone would leave the means 0.28 / 7 = 0.04)
    logs = [[math.log(x) for x in g] for g in lengths]
    within = statistics.mean(statistics.pvariance(g) for g in logs)
    between = statistics.pvariance([statistics.mean(g) for g in logs])
    assert within == pytest.approx(0.28, rel=0.2) and between == pytest.approx(0.53, rel=0.2)


def test_lognormal_draws_have_their_mean_and_cv():
    xs = [lognormal(10.0, 1.0, 7, i) for i in range(20000)]
    assert statistics.mean(xs) == pytest.approx(10.0, rel=0.05)
    assert statistics.pstdev(xs) / statistics.mean(xs) == pytest.approx(1.0, rel=0.1)
    assert lognormal(5.0, 0.0, 1) == 5.0


def test_fitting_recovers_the_length_distribution_from_logged_steps(tmp_path):
    truth = WorkloadSpec(response_tokens=600.0, length_sigma=0.8, max_tokens=2048)
    w = Workload(truth, seed=1)
    rows = []
    for step in range(1, 41):  # 64 samples per step, as a run's metrics.jsonl logs them
        lengths = [min(2048, w.response_tokens(w.prompt(step * 100 + k), s)) for k in range(8) for s in range(8)]
        rows.append({"step": step, "time/step": 1.0, "batch/samples": 64,
                     "response_length/mean": statistics.mean(lengths), "response_length/max": max(lengths),
                     "response_length/truncated_frac": sum(x >= 2048 for x in lengths) / 64})
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{broken\n")
    fit = fit_lengths(path, 2048)
    assert fit.max_tokens == 2048
    assert fit.length_sigma == pytest.approx(0.8, abs=0.25)
    assert fit.response_tokens == pytest.approx(600, rel=0.25)


def test_fitting_a_file_without_training_steps_says_what_it_needs(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "val/accuracy": 0.1}\n')
    with pytest.raises(ValueError, match="response_length/mean"):
        fit_lengths(path, 512)


def test_a_runs_recorded_groups_are_replayed_step_by_step(tmp_path):
    from gyre.sim.workload import RecordedWorkload, recorded_groups

    gen = tmp_path / "generations"
    gen.mkdir()
    for step, lengths in ((1, {"g1": [3, 5], "g2": [60, 64]}), (2, {"g3": [7, 9]})):
        rows = [{"group": g, "sample": i, "response_tokens": n} for g, ns in lengths.items() for i, n in enumerate(ns)]
        (gen / f"step_{step}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    (gen / "val_step_2.jsonl").write_text('{"group": "v", "sample": 0, "response_tokens": 999}')
    steps = recorded_groups(tmp_path)
    assert steps == [[(None, (3, 5)), (None, (60, 64))], [(None, (7, 9))]]
    w = RecordedWorkload(WorkloadSpec(), 0, steps, per_step=2)
    first = [tuple(w.response_tokens(w.prompt(i), s) for s in range(2)) for i in range(2)]
    assert set(first) <= {(3, 5), (60, 64)}  # step 1's prompts get step 1's groups
    assert [w.response_tokens(w.prompt(i), s) for i in (2, 5) for s in range(2)] == [7, 9, 7, 9]  # then step 2's
    (gen / "step_3.jsonl").write_text('{"group": "g4", "sample": 0, "response_tokens": 4}')
    assert recorded_groups(tmp_path) is None  # a partial group: the files do not hold whole groups
