"""Phase spans: recorded by the workers (in-process and Ray actors alike), taken by the driver once per
step, written to timeline.jsonl and truncated on resume; idle fractions computed from them by hand."""

import json
import threading
import time

import pytest

from gyre.cluster.group import RoleGroup
from gyre.cluster.spans import SpanRecorder, recorder_of, timed
from gyre.engines.hf_rollout import HFRolloutEngine
from gyre.engines.loop import EngineLoop
from gyre.models.loading import load_causal_lm, load_tokenizer
from gyre.tracking.report_timeline import busy_seconds, gantt_window, idle_by_role, lane_label, merge_bars, sessions
from gyre.tracking.timeline import Span, Timeline, read_spans, role_of
from gyre.types import GenerationRequest, SamplingParams


class Scorer:
    """A worker with one recorded phase (a real actor class in the shape of the reward workers)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    @timed("reward")
    def score(self, n: int) -> int:
        time.sleep(self.seconds)
        return n


def test_recorder_merges_close_spans_of_a_phase_and_bounds_its_buffer():
    r = SpanRecorder(limit=3)
    r.add("generate", 10.0, 10.5)
    r.add("generate", 10.51, 11.0)  # 0.01 s after: one busy interval
    r.add("weight_sync", 11.0, 11.2)
    r.add("generate", 11.3, 11.4)  # a weight sync in between: a span of its own
    r.add("generate", 11.35, 11.38)  # inside the last one (another thread's): merged
    assert r.take() == ([("generate", 10.0, 11.0), ("weight_sync", 11.0, 11.2), ("generate", 11.3, 11.4)], 0)
    for i in range(5):
        r.add("train", i, i + 0.5)
    spans, dropped = r.take()
    assert [s[1] for s in spans] == [2, 3, 4] and dropped == 2
    assert r.take() == ([], 0)


def test_idle_fraction_and_ema_by_hand():
    assert busy_seconds([(0, 2), (1, 3), (5, 6)]) == 4  # [0, 3] and [5, 6]
    spans = [Span("policy", 0, "train", 0, 4, 1), Span("policy", 1, "train", 0, 2, 1),
             Span("policy", 1, "logprobs", 1, 3, 1), Span("rollout", 0, "generate", 2, 10, 1),
             Span("driver", 0, "validate", 10, 20, 1)]  # the driver is not a role with an idle fraction
    rows, window = idle_by_role(spans)
    assert window == 10  # the workers' first start to last end
    policy, rollout = rows
    # policy 0 busy 4 s (idle 0.6), policy 1 busy [0, 3] = 3 s (idle 0.7): mean 0.65
    assert (policy.role, policy.workers, policy.busy_s, policy.idle_fraction) == ("policy", 2, 3.5, pytest.approx(0.65))
    assert policy.phase_s == {"train": 6, "logprobs": 2}
    assert (rollout.role, rollout.idle_fraction) == ("rollout", pytest.approx(0.2))


def test_downtime_between_sessions_is_not_idle_time_by_hand():
    # Two 10 s steps, the run down for 990 s between them (a resume), then a step 30 s after the last span:
    # the gap threshold is max(60 s, 5 x the 10 s median step) = 60 s, so the 990 s gap splits, the 30 s one not.
    spans = [Span("policy", 0, "train", 0, 4, 1), Span("rollout", 0, "generate", 2, 10, 1),
             Span("policy", 0, "train", 1000, 1004, 2), Span("rollout", 0, "generate", 1002, 1010, 2),
             Span("policy", 0, "train", 1040, 1042, 3), Span("rollout", 0, "generate", 1040, 1050, 3)]
    assert sessions(spans) == [(0, 10), (1000, 1050)]
    rows, window = idle_by_role(spans)
    assert window == 60  # 10 + 50 s, not 1050
    policy, rollout = rows
    assert policy.idle_fraction == pytest.approx(1 - 10 / 60) and rollout.idle_fraction == pytest.approx(1 - 26 / 60)


def test_the_chart_draws_the_last_steps_and_merges_spans_closer_than_it_can_show():
    spans = [Span("rollout", 0, "generate", 0, 1, 1), Span("rollout", 0, "generate", 1.001, 2, 2),
             Span("rollout", 0, "weight_sync", 2, 2.5, 2), Span("rollout", 0, "generate", 2.5, 3, 3)]
    # Range 3 s: spans of a lane and phase within 3 / 1500 = 2 ms merge; the weight sync keeps them apart after.
    bars = merge_bars(spans)
    assert [(b.phase, b.start, b.end, b.steps) for b in bars] == [
        ("generate", 0, 2, "1-2"), ("weight_sync", 2, 2.5, "2"), ("generate", 2.5, 3, "3")]
    many = [Span("policy", 0, "train", n, n + 0.5, n) for n in range(1, 31)]
    shown, first, last = gantt_window(many)
    assert (len(shown), first, last) == (20, 11, 30)
    assert lane_label("<i>judge</i>", 2) == "&lt;i&gt;judge&lt;/i&gt; 2"


def test_role_names():
    assert [role_of(n) for n in ("policy", "reward.math", "judge.essay", "reward_model.chat", "critic.1")] == \
        ["policy", "reward", "reward", "reward", "critic"]


def test_in_process_workers_spans_reach_timeline_jsonl_and_a_resume_drops_later_steps(tmp_path):
    # Two domains' reward groups: their workers number on (reward 0, 1, 2), one recorder per actor instance.
    a = RoleGroup.local("reward.a", Scorer, [(0.01,), (0.01,)])
    b = RoleGroup.local("reward.b", Scorer, [(0.01,)])
    timeline = Timeline(tmp_path)
    for step in (1, 2):
        a.call(Scorer.score, 1)
        b.call(Scorer.score, 2)
        with timeline.driver("checkpoint", step):
            pass
        timeline.collect([a, b, a], step)  # a group listed twice counts once
    spans = read_spans(tmp_path / "timeline.jsonl")
    assert sorted({(s.role, s.rank) for s in spans}) == [("driver", 0), ("reward", 0), ("reward", 1), ("reward", 2)]
    assert [s.step for s in spans if s.role == "reward"] == [1, 1, 1, 2, 2, 2]
    assert all(s.phase == "reward" and s.end - s.start >= 0.009 for s in spans if s.role == "reward")
    assert list(json.loads((tmp_path / "timeline.jsonl").read_text().splitlines()[0])) == \
        ["role", "rank", "phase", "start", "end", "step"]
    Timeline(tmp_path, resume_step=1)
    assert {s.step for s in read_spans(tmp_path / "timeline.jsonl")} == {1}
    Timeline(tmp_path, restart=True)
    assert read_spans(tmp_path / "timeline.jsonl") == []
    a.kill()
    b.kill()


def test_a_busy_worker_answers_on_its_probe_thread_and_a_late_one_keeps_its_spans(tmp_path):
    slow = RoleGroup.local("reward", Scorer, [(0.6,)])
    timeline = Timeline(tmp_path, deadline_s=5.0)
    slow.call(Scorer.score, 1)
    running = slow.submit(Scorer.score, 2)  # busy while the driver takes: the take does not queue behind it
    t0 = time.monotonic()
    timeline.collect([slow], 1)
    assert time.monotonic() - t0 < 0.5 and len(read_spans(tmp_path / "timeline.jsonl")) == 1
    slow.gather(running, Scorer.score)
    timeline.collect([slow], 2)
    assert [s.step for s in read_spans(tmp_path / "timeline.jsonl")] == [1, 2]
    slow.kill()
    timeline.collect([], 3)  # nothing left to take


def test_engine_loop_records_decoding_as_busy_intervals_and_weight_updates(tiny_model_dir):
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir))
    host = type("Host", (), {})()
    loop = EngineLoop(engine, spans=recorder_of(host))
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    ids = engine.tokenizer("3+4=")["input_ids"]
    thread = threading.Thread(target=lambda: list(loop.serve(idle_poll_s=0.01)), daemon=True)
    thread.start()
    loop.add([GenerationRequest("a", ids, params, n=2, seed=1)])
    deadline = time.monotonic() + 30
    while engine.busy or not recorder_of(host)._spans:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    loop.update(lambda: (engine.load_weights(state, 1), engine.weight_version)[1], timeout_s=10)
    loop.stop(timeout_s=10)
    thread.join(10)
    spans, _ = recorder_of(host).take()
    # Eight decoding steps in a row: one "generate" span, then the weight update's.
    assert [s[0] for s in spans] == ["generate", "weight_sync"]
    assert spans[0][2] <= spans[1][1]
