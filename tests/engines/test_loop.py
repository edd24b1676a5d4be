"""The engine's command loop with a real tiny-model engine, served on one thread and controlled from another."""

import threading

import pytest

from gyre.engines.hf_rollout import HFRolloutEngine
from gyre.engines.loop import EngineLoop
from gyre.models.loading import load_causal_lm, load_tokenizer
from gyre.types import GenerationRequest, SamplingParams

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=12)


@pytest.fixture()
def engine(tiny_model_dir):
    return HFRolloutEngine(load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir))


def request(engine, text, rid, seed=0, n=1, prefix=()):
    return GenerationRequest(rid, engine.tokenizer(text)["input_ids"], PARAMS, n=n, seed=seed, prefix=prefix)


class Served:
    """``loop.serve()`` running on its own thread, collecting every part it yields."""

    def __init__(self, loop: EngineLoop):
        self.loop, self.parts, self.error = loop, [], None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for part in self.loop.serve(idle_poll_s=0.01):
                self.parts.append(part)
        except BaseException as exc:  # noqa: BLE001
            self.error = exc

    def results(self):
        return {(r.request_id, r.sample_index): r for part in self.parts for r in part}

    def wait_for(self, count, timeout=30.0):
        import time

        deadline = time.monotonic() + timeout
        while len(self.results()) < count and time.monotonic() < deadline and self.error is None:
            time.sleep(0.005)
        assert self.error is None and len(self.results()) >= count, (self.error, len(self.results()))

    def stop(self):
        self.loop.stop(timeout_s=10)
        self.thread.join(10)


def test_requests_added_from_another_thread_are_served(engine):
    alone = engine.generate([request(engine, "3+4=", "a", seed=1, n=3)])
    served = Served(EngineLoop(engine, emit_every=2))
    served.loop.add([request(engine, "3+4=", "a", seed=1, n=3)])
    served.wait_for(3)
    assert [served.results()[("a", i)].response_ids for i in range(3)] == [r.response_ids for r in alone]
    served.stop()
    assert not served.thread.is_alive()


def test_update_with_requests_in_flight_continues_them_under_the_new_version(engine):
    (full,) = engine.generate([request(engine, "40-13=", "u", seed=8)])
    loop = EngineLoop(engine)
    engine.add([request(engine, "40-13=", "u", seed=8)])
    for _ in range(4):  # four tokens under version 0, before anyone serves
        engine.step()
    served = Served(loop)
    same = {k: v.clone() for k, v in engine.model.state_dict().items()}
    version = loop.update(lambda: (engine.load_weights(same, 1), engine.weight_version)[1], timeout_s=10)
    served.wait_for(1)
    (result,) = served.results().values()
    assert version == 1 and result.response_ids == full.response_ids
    assert result.versions[:4] == [0] * 4 and set(result.versions[4:]) <= {0, 1} and result.versions[-1] == 1
    served.stop()


def test_an_abort_returns_the_partial_on_the_stream_and_a_stop_ends_serving(engine):
    long = GenerationRequest("slow", engine.tokenizer("9*9=")["input_ids"],
                             SamplingParams(temperature=1.0, max_new_tokens=10_000, ignore_eos=True), seed=2)
    served = Served(EngineLoop(engine))
    served.loop.add([long])
    import time

    time.sleep(0.2)
    served.loop.abort(["slow"])
    served.wait_for(1)
    (partial,) = served.results().values()
    assert partial.finish_reason == "abort" and 0 < len(partial.response_ids) < 10_000
    served.stop()
    assert not engine.busy


def test_a_failed_weight_load_is_the_callers_error_and_the_engine_goes_on(engine):
    served = Served(EngineLoop(engine))

    def broken():
        raise ValueError("weight bundle holds version 3, expected 2")

    with pytest.raises(ValueError, match="holds version 3"):
        served.loop.update(broken, timeout_s=10)
    served.loop.add([request(engine, "1+2=", "after", seed=3)])
    served.wait_for(1)  # not left suspended
    served.stop()
