"""Environment slots spread over environment worker actors: ``EnvCall`` commands in, ``EnvResult``
events out, for the rollout driver to wait on beside engines and rewards.

Slot ``k`` is slot ``k % per_worker`` of worker ``k // per_worker``. Each call has a deadline: the
slot's own (enforced in the worker, which kills a hung environment) plus a margin; a call still
unanswered after that, or a worker that died, fails every call pending on that worker (``crashed`` /
``timeout``: one lost episode each) and the worker is replaced by a fresh one, whose environments
start fresh. The run goes on.
"""

from __future__ import annotations

import logging
import time

from gyre.cluster import transport
from gyre.cluster.group import RoleGroup
from gyre.cluster.workers import ENV, EnvWorker
from gyre.envs.calls import EnvCall, EnvResult, SlotPool
from gyre.envs.protocol import EnvFailure

log = logging.getLogger(__name__)

MARGIN_S = 30.0
"""Beyond a slot's own deadline, how long the pool waits before it treats the worker as wedged."""


class EnvPool:
    def __init__(self, workers: RoleGroup, per_worker: int, deadline_s: float):
        """``deadline_s``: the longest a slot may take for one call (its reset or step timeout)."""
        self.workers, self.per_worker = workers, per_worker
        self.deadline_s = deadline_s + MARGIN_S
        self.slots = SlotPool(len(workers) * per_worker)
        self._pending: dict = {}
        """ref -> (call, worker rank, deadline)."""
        self.worker_restarts = 0

    def submit(self, call: EnvCall) -> None:
        rank, local = divmod(call.slot, self.per_worker)
        ref = self.workers.submit_to(rank, EnvWorker.call, local, call.op, call.arg, lane=ENV)
        self._pending[ref] = (call, rank, time.monotonic() + self.deadline_s)

    def refs(self) -> list:
        return list(self._pending)

    def poll(self, ready: list) -> list[EnvResult]:
        """The answers among ``ready`` refs, and failures for calls past their deadline or on dead workers."""
        out, broken = [], {}
        for ref in [r for r in ready if r in self._pending]:
            call, rank, _ = self._pending[ref]
            try:
                value = transport.get(ref)
            except transport.RemoteError as exc:
                broken[rank] = f"it failed: {str(exc).splitlines()[0][:200]}"  # its calls all fail below
                continue
            del self._pending[ref]
            out.append(EnvResult(call.call_id, value))
        now = time.monotonic()
        for _, rank, deadline in self._pending.values():
            if now > deadline:
                broken.setdefault(rank, f"a call went {self.deadline_s:g} s unanswered")
        for rank, cause in broken.items():
            out += self._replace(rank, cause)
        return out

    def _replace(self, rank: int, cause: str) -> list[EnvResult]:
        """Fail every call pending on worker ``rank`` and put a fresh worker in its place."""
        failed = []
        for ref, (call, r, _) in list(self._pending.items()):
            if r == rank:
                del self._pending[ref]
                failed.append(EnvResult(call.call_id, EnvFailure("crashed", f"environment worker {rank} was lost "
                                                                            f"({cause})")))
        log.warning("environment worker %d was lost (%s): %d call(s) failed, starting a fresh one", rank, cause,
                    len(failed))
        self.workers.respawn(rank)
        self.worker_restarts += 1
        return failed

    def close(self) -> None:
        if len(self.workers):
            self.workers.call(EnvWorker.close)
