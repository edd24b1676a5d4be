"""The request book's dispatch as capacity frees (``slots``): sans-IO, commands read off the outbox."""

from gyre.rollout.requests import Abort, Generate, RequestBook
from gyre.types import GenerationRequest, GenerationResult, SamplingParams


def req(rid: str, n: int = 1) -> GenerationRequest:
    return GenerationRequest(rid, [1, 2, 3], SamplingParams(max_new_tokens=8), n=n)


def done(rid: str, i: int = 0) -> GenerationResult:
    return GenerationResult(rid, i, [1, 2, 3], [4], "", [0.0], "stop", [0])


def generated(outbox: list) -> list[tuple[int, list[str]]]:
    out = [(c.engine, [r.request_id for r in c.requests]) for c in outbox if isinstance(c, Generate)]
    outbox.clear()
    return out


def test_requests_beyond_an_engines_slots_wait_and_go_to_the_first_engine_with_room():
    outbox: list = []
    book = RequestBook(2, outbox, 8, slots=2)
    placed = book.assign([req(f"r{k}") for k in range(6)], lambda rid: "g")
    assert placed == {"r0": 0, "r1": 1, "r2": 0, "r3": 1, "r4": -1, "r5": -1}
    assert generated(outbox) == [(0, ["r0", "r2"]), (1, ["r1", "r3"])]
    assert (book.outstanding, list(book.held)) == (6, ["r4", "r5"])
    assert book.settle(done("r3")) == "g"  # engine 1 has room again: the oldest held request goes there
    assert generated(outbox) == [(1, ["r4"])]
    book.abort({"r5": -1, "r0": 0})  # a held request is dropped, a live one stopped on its engine
    assert [c.by_engine for c in outbox if isinstance(c, Abort)] == [{0: ("r0",)}]
    assert not book.held and book.samples("r5") == set()


def test_a_lost_engine_gets_nothing_and_a_joined_one_takes_the_held_requests():
    outbox: list = []
    book = RequestBook(1, outbox, 8, slots=1)
    book.assign([req("a"), req("b"), req("c")], lambda rid: rid)
    assert generated(outbox) == [(0, ["a"])]
    assert book.lose(0) == [("a", "a", [0])]
    book.assign([req("a.1")], lambda rid: "a")
    assert generated(outbox) == [] and list(book.held) == ["b", "c", "a.1"]
    book.grow()
    assert generated(outbox) == [(1, ["b"])]
    book.back(0)
    assert generated(outbox) == [(0, ["c"])]


def test_a_request_of_several_samples_fits_an_empty_engine_whatever_its_slots():
    outbox: list = []
    book = RequestBook(1, outbox, 8, slots=2)
    book.assign([req("big", n=4), req("next")], lambda rid: rid)
    assert generated(outbox) == [(0, ["big"])] and book.samples("next") == {0}
    for i in range(3):
        book.settle(done("big", i))
    assert generated(outbox) == [(0, ["next"])]  # 1 sample left + 1 fits in 2 slots


def test_the_open_engine_heap_stays_bounded_over_a_long_run_of_full_engines():
    outbox: list = []
    book = RequestBook(4, outbox, 8, slots=4)
    book.assign([req(f"r{k}") for k in range(5000)], lambda rid: "g")
    for k in range(5000 - 16):  # every engine stays full: each sample back is replaced by a held one
        book.settle(done(f"r{k}"))
        outbox.clear()
    assert book.count == [4, 4, 4, 4] and not book.held
    assert len(book._open) <= 4 * 4 + 64
    book.lose(1)  # a rebuilt heap still skips engines that are down and finds room where it frees
    book.settle(done("r4986"))
    assert book._room(1) in (0, 2, 3)


def test_an_episodes_next_turn_goes_to_its_engine_while_that_one_is_up_and_has_room():
    outbox: list = []
    book = RequestBook(3, outbox, 8)  # no slots: least loaded, unless preferred
    assert book.assign([req("e/0#0")], lambda rid: "g") == {"e/0#0": 0}
    assert book.assign([req("x")], lambda rid: "g") == {"x": 1}
    assert book.assign([req("e/0#1")], lambda rid: "g", prefer=2) == {"e/0#1": 2}  # though 2 is not least loaded
    book.lose(2)
    assert book.assign([req("e/0#2")], lambda rid: "g", prefer=2)["e/0#2"] != 2  # down: any other
    generated(outbox)
    slotted = RequestBook(2, outbox, 8, slots=1)
    slotted.assign([req("a")], lambda rid: "g", prefer=1)
    assert generated(outbox) == [(1, ["a"])]
    assert slotted.assign([req("b")], lambda rid: "g", prefer=1) == {"b": 0}  # full: where there is room
    assert slotted.assign([req("c")], lambda rid: "g", prefer=0) == {"c": -1}  # nowhere: held, in order
