"""Time-sharing of devices between colocated roles.

Before a phase runs, ``activate(role)`` offloads every resident role that shares a device with it and
reloads the role itself, so idle roles do not hold device memory while another role computes. Roles
that share nothing are never touched (disaggregated roles stay resident). When the plan does not
offload (CPU runs), this is a no-op: time-sharing then only means the phases run one after another.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gyre.config.derive import RunPlan


class Offloadable(Protocol):
    """What every role that time-shares a device answers (policy and critic ranks, rollout engines,
    reference and teacher workers)."""

    def offload(self) -> None:
        """Move this worker's device state (weights, optimizer state, caches) to the host."""

    def reload(self) -> None:
        """Bring it back onto the device (rollout engines take ``values=False``: a whole new version loads
        next, so the old weights need not come back)."""


class _Group(Protocol):
    def call(self, method, *args, **kwargs) -> list: ...


class TimeShare:
    def __init__(self, plan: RunPlan, groups: Mapping[str, _Group], resident: set[str]):
        """``resident``: roles whose state is on their devices now (workers may start offloaded)."""
        self.plan = plan
        self.groups = groups
        self.resident = set(resident)
        self.transitions = 0

    def _sharing(self, role: str) -> list[str]:
        out = []
        for a, b in self.plan.shared_devices:
            other = b if a == role else a if b == role else None
            if other is not None and other in self.groups:
                out.append(other)
        return out

    def activate(self, role: str, values: bool = True) -> None:
        """``role`` on its devices, the roles sharing them offloaded. ``values=False`` (rollout engines about to
        load a whole new version): the role's weights get device memory without their old values."""
        if not self.plan.offload:
            return
        for other in self._sharing(role):
            if other in self.resident:
                self.groups[other].call(Offloadable.offload)
                self.resident.discard(other)
        if role not in self.resident:
            self.groups[role].call(Offloadable.reload, *(() if values else (False,)))
            self.resident.add(role)
            self.transitions += 1
