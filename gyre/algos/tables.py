"""Algorithm pieces selected by name, and the fields of the specs that configure them.

A :class:`Registry` maps a config name (``policy_loss: cispo``, ``estimator: rloo``) to an entry whose
functions share one signature, so a caller looks the name up once, when it builds the object that uses
the entry, and then calls the entry without branching on the name. The tables themselves sit beside the
functions they list: ``POLICY_LOSSES`` in ``policy_loss``, ``ESTIMATORS`` in ``advantages``.

``knob`` and ``run_field`` declare the fields of a spec dataclass (``PolicyLossSpec``) together with the
rules the config checks, so the config section that produces the spec is derived from it
(``gyre.config.base.section_from_spec``) instead of repeating every field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

Entry = TypeVar("Entry")


@dataclass(frozen=True)
class Registry(Generic[Entry]):
    """Named entries of one kind; the order of ``entries`` is the order names are listed in."""

    kind: str
    """What an entry is, for error messages ("policy loss")."""
    entries: dict[str, Entry]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def get(self, name: str) -> Entry:
        """The entry called ``name``; an unknown name is a ValueError that lists the valid ones."""
        try:
            return self.entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.entries)}") from None


def knob(default: Any, *, choices: Registry | None = None, ge: float | None = None, gt: float | None = None,
         le: float | None = None, lt: float | None = None) -> Any:
    """A spec field that is also a config key: its default, and what the config accepts (a name of
    ``choices``, or a number within the bounds; None for no bound)."""
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le), ("lt", lt)) if v is not None}
    return field(default=default, metadata={"choices": choices, **bounds})


def run_field(default: Any, source: str) -> Any:
    """A spec field the driver fills from the run (``source`` says from where), not a config key."""
    return field(default=default, metadata={"from_run": source})
