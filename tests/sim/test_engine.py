"""The simulated engine: the protocol's token-by-token contract, and event skipping that agrees with it."""

import pytest

from gyre.config.catalog import DeviceClass, ModelShape
from gyre.engines.base import RolloutEngine
from gyre.sim.cost import CostModel
from gyre.sim.engine import SimEngine
from gyre.types import GenerationRequest, SamplingParams, Trajectory

DEVICE = DeviceClass("toy", 1.0, 1.0, 10.0, 1.0, compute_eff=1.0, mem_eff=1.0, step_overhead_s=0.001)
COST = CostModel(DEVICE, ModelShape("toy", 1e8, 2, 1, 250))
LENGTHS = {("a", 0): 5, ("a", 1): 9, ("b", 0): 3, ("c", 0): 40}


def engine(max_rows=None) -> SimEngine:
    return SimEngine(COST, lambda r, i: LENGTHS[(r.request_id, i)], max_rows)


def request(rid: str, n: int = 1, budget: int = 100, prefix=()) -> GenerationRequest:
    return GenerationRequest(rid, [1] * 10, SamplingParams(max_new_tokens=budget), n=n, prefix=tuple(prefix))


def test_it_implements_the_engine_protocol():
    assert isinstance(engine(), RolloutEngine)


def test_event_skipping_matches_decoding_token_by_token():
    by_step, by_event = engine(max_rows=2), engine(max_rows=2)
    for e in (by_step, by_event):
        e.add([request("a", n=2), request("b"), request("c", budget=30)])
    finished_step = []
    while by_step.busy:
        finished_step += [(r.request_id, r.sample_index, len(r.response_ids), r.finish_reason, round(by_step.now, 9))
                          for r in by_step.step()]
    finished_event = []
    while by_event.busy:
        t = by_event.next_event()
        finished_event += [(r.request_id, r.sample_index, len(r.response_ids), r.finish_reason, round(by_event.now, 9))
                           for r in by_event.advance(t)]
    assert finished_event == finished_step
    # two rows at a time: a/0 (5) and a/1 (9) first; b (3) joins when a/0 ends; c is cut at its budget of 30
    assert [f[:4] for f in finished_step] == [("a", 0, 5, "stop"), ("b", 0, 3, "stop"), ("a", 1, 9, "stop"),
                                              ("c", 0, 30, "length")]
    assert by_event.busy_s == pytest.approx(by_step.busy_s)


def test_a_weight_update_mid_sample_stamps_each_token_with_its_version():
    e = engine()
    e.add([request("a", n=2)])
    e.advance(e.now + COST.decode_span_s(2, 20, 3) + COST.prefill_s(20))  # prefill, then three steps
    assert e.update(1, partial=True) == []
    done = e.advance(float("inf"))
    sample1 = next(r for r in done if r.sample_index == 1)
    assert list(sample1.versions) == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    t = Trajectory.from_result(None, sample1)
    assert [(len(s.token_ids), s.weight_version) for s in t.segments] == [(3, 0), (6, 1)]
    assert t.weight_version == 0


def test_without_partial_rollouts_an_update_hands_the_rows_back_aborted():
    e = engine()
    e.add([request("a")])
    e.advance(e.now + COST.prefill_s(10) + COST.decode_span_s(1, 10, 2))
    dropped = e.update(1, partial=False)
    assert [(r.request_id, len(r.response_ids), r.finish_reason) for r in dropped] == [("a", 2, "abort")]
    assert not e.busy


def test_without_partial_rollouts_an_update_also_hands_back_queued_requests_as_the_engine_loop_does():
    e = engine(max_rows=1)
    e.add([request("a"), request("b")])  # one row: b waits behind a
    e.advance(e.now + COST.prefill_s(10) + COST.decode_span_s(1, 10, 2))
    dropped = e.update(1, partial=False)
    assert [(r.request_id, len(r.response_ids), r.finish_reason) for r in dropped] == [("a", 2, "abort"),
                                                                                        ("b", 0, "abort")]
    assert not e.busy


def test_an_aborted_sample_continues_on_another_engine_from_its_tokens():
    first, second = engine(), engine()
    first.add([request("a", n=2)])
    first.advance(first.now + COST.prefill_s(20) + COST.decode_span_s(2, 20, 4))
    part = next(r for r in first.abort(["a"]) if r.sample_index == 1)
    assert (len(part.response_ids), part.offset, part.finish_reason) == (4, 0, "abort")
    second.load_weights(None, 3)
    cont = request("a", prefix=[0] * 4)
    cont.first_sample = 1
    second.add([cont])
    (rest,) = second.advance(float("inf"))
    assert (len(rest.response_ids), rest.offset, list(rest.versions)) == (5, 4, [3] * 5)
    t = Trajectory.from_result(None, part)
    t.extend(rest)
    assert [(len(s.token_ids), s.weight_version) for s in t.segments] == [(4, 0), (5, 3)]


def test_a_reserving_engine_admits_by_the_token_budget_not_the_samples_length():
    """gyre's HF engine: rows x the widest prompt + budget must fit; it cannot know a sample ends at 50."""
    from gyre.config.catalog import EngineClass

    hf = CostModel(DEVICE, ModelShape("toy", 1e8, 2, 1, 250), engine=EngineClass("hf", admission="reserve"))
    for budget, rows in ((50, 2), (100, 1)):  # 2 x (10 + 50) = 120 <= 130; 2 x (10 + 100) = 220 > 130
        e = SimEngine(hf, lambda r, i: 50)
        e.kv_tokens = 130
        e.add([request(f"r{k}", budget=budget) for k in range(3)])
        e.step()
        assert (len(e.rows), len(e.waiting)) == (rows, 3 - rows)
        e.advance(float("inf"))
        assert e.preemptions == 0


def test_a_paged_engine_admits_what_fits_now_and_preempts_the_newest_row_when_the_cache_fills():
    # Three rows of a 10-token prompt that each end at 50 tokens, 130 tokens of cache: all three join (33
    # tokens held); after 33 steps they hold 129 and the next step does not fit: the newest (r2) is
    # preempted with 33 tokens, r0 and r1 finish 17 steps later, then r2 rejoins, prefills 43 and ends.
    e = SimEngine(COST, lambda r, i: 50)
    e.kv_tokens = 130
    e.add([request(f"r{k}") for k in range(3)])
    e.step()
    assert (len(e.rows), len(e.waiting)) == (3, 0)
    done = e.advance(float("inf"))
    assert [(r.request_id, len(r.response_ids)) for r in done] == [("r0", 50), ("r1", 50), ("r2", 50)]
    assert e.preemptions == 1
    want = (COST.prefill_s(30) + COST.decode_span_s(3, 30, 33) + COST.decode_span_s(2, 86, 17)
            + COST.prefill_s(43) + COST.decode_span_s(1, 43, 17))
    assert e.busy_s == pytest.approx(want, rel=1e-12)
    assert [sum(n for _, n in r.versions.runs) for r in done] == [50, 50, 50]  # every token kept its version


def test_preemption_skips_events_as_it_decodes_token_by_token():
    by_step, by_event = engine(), engine()
    for e in (by_step, by_event):
        e.kv_tokens = 50  # four rows of 10 + 1 join; two steps later they no longer fit
        e.add([request("a", n=2), request("b"), request("c", budget=30)])
    stepped = []
    while by_step.busy:
        stepped += [(r.request_id, r.sample_index, len(r.response_ids)) for r in by_step.step()]
    evented = []
    while by_event.busy:
        done = by_event.advance(by_event.next_event())
        evented += [(r.request_id, r.sample_index, len(r.response_ids)) for r in done]
    assert evented == stepped and by_event.preemptions == by_step.preemptions > 0
    assert by_event.busy_s == pytest.approx(by_step.busy_s, rel=1e-12)


def test_a_padded_engine_reads_every_rows_kv_at_the_widest_rows_length():
    from gyre.config.catalog import EngineClass

    padded = CostModel(DEVICE, ModelShape("toy", 1e8, 2, 1, 250), engine=EngineClass("hf", padded_kv=True))
    prompts, lengths = {"s": 10, "l": 30}, {"s": 4, "l": 2}
    requests = [GenerationRequest(rid, [1] * n, SamplingParams(max_new_tokens=100)) for rid, n in prompts.items()]
    for cost, first_two in ((COST, 10 + 30), (padded, 2 * 30)):
        e = SimEngine(cost, lambda r, i: lengths[r.request_id])
        e.add(requests)
        e.advance(float("inf"))
        # both rows prefilled (40 tokens), two steps together (contexts 40 or 2 x 30, growing 2 a step), then
        # "s" alone at 12 tokens for two steps: the widest row's length is its own once "l" has left
        want = cost.prefill_s(40) + cost.decode_span_s(2, first_two, 2) + cost.decode_span_s(1, 12, 2)
        assert e.busy_s == pytest.approx(want, rel=1e-12)


def test_a_padded_engine_skips_events_as_it_decodes_token_by_token():
    from gyre.config.catalog import EngineClass

    padded = CostModel(DEVICE, ModelShape("toy", 1e8, 2, 1, 250), engine=EngineClass("hf", padded_kv=True))
    by_step, by_event = (SimEngine(padded, lambda r, i: LENGTHS[(r.request_id, i)], 2) for _ in range(2))
    for e in (by_step, by_event):
        e.add([request("a", n=2), request("b"), request("c", budget=30)])
    while by_step.busy:
        by_step.step()
    while by_event.busy:
        by_event.advance(by_event.next_event())
    assert by_event.busy_s == pytest.approx(by_step.busy_s, rel=1e-12)
    plain = engine(2)  # rows that joined later are shorter than the widest: padding reads more
    plain.add([request("a", n=2), request("b"), request("c", budget=30)])
    plain.advance(float("inf"))
    assert by_event.busy_s > plain.busy_s
