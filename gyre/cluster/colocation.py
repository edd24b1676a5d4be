"""Time-sharing of devices between colocated roles.

Before a phase runs, ``activate(role)`` offloads every resident role that shares a device with it and
reloads the role itself, so at most one role's state occupies a shared device at a time. Roles that
share nothing are never touched (disaggregated roles stay resident). When the plan does not offload
(CPU runs), this is a no-op: time-sharing then only means the phases run one after another.
"""

from __future__ import annotations

from gyre.cluster.group import RoleGroup
from gyre.config.derive import RunPlan


class TimeShare:
    def __init__(self, plan: RunPlan, groups: dict[str, RoleGroup]):
        self.plan = plan
        self.groups = groups
        self.resident = set(groups)
        self.transitions = 0

    def _conflicts(self, role: str) -> list[str]:
        out = []
        for (a, b) in self.plan.shared_devices:
            if role in (a, b):
                other = b if a == role else a
                if other in self.groups:
                    out.append(other)
        return out

    def activate(self, role: str) -> None:
        if not self.plan.offload:
            return
        import ray

        refs = []
        for other in self._conflicts(role):
            if other in self.resident:
                refs += self.groups[other].submit("offload")
                self.resident.discard(other)
        ray.get(refs)
        if role not in self.resident:
            self.groups[role].call("reload")
            self.resident.add(role)
            self.transitions += 1
