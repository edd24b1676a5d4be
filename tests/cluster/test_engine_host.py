"""EngineHost: the actor methods in front of a rollout engine's command loop."""

import threading
import time

from gyre.cluster.workers import EngineHost


class SlowHost(EngineHost):
    """A host whose engine takes a moment to build, as a real model load does."""

    def __init__(self):
        self.built = 0

    def _engine(self):
        self.built += 1
        time.sleep(0.05)
        return object()


def test_serve_and_the_first_add_on_two_threads_share_one_loop():
    """Ray runs ``serve`` and ``add`` in different concurrency groups, so their first calls race: both
    must get the same loop, or the requests wait in a queue nobody serves (a hang seen under load)."""
    host = SlowHost()
    start, loops = threading.Barrier(4), []

    def first_call():
        start.wait()
        loops.append(host._engine_loop())

    threads = [threading.Thread(target=first_call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(loops) == 4 and all(loop is loops[0] for loop in loops)
    assert host.built == 1
