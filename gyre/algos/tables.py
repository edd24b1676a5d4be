"""Algorithm pieces selected by name, and the fields of the specs that configure them.

A :class:`Registry` maps a config name (``loss.variant: cispo``, ``advantage.estimator: rloo``) to a row:
the functions that variant runs, all with one signature per table, what the config must know about it
(capabilities) and the dataclass of its own knobs. A caller looks the name up once, when it builds the
object that uses the row, and then calls the row without branching on the name.

The tables are torch-free (``loss_table``, ``estimator_table``), so the config reads names, capabilities
and knobs without importing torch; each row's function is a thin adapter beside it that imports its
tensor maths (``policy_loss``, ``advantages``, ...) when it first runs.

``knob`` and ``run_field`` declare the fields of a spec dataclass (``PolicyLossSpec``) together with the
rules the config checks, so the config section that produces the spec is derived from it
(``gyre.config.base.section_from_spec``) instead of repeating every field; ``variant_knobs`` declares the
field that holds the chosen row's knobs, which the config turns into one sub-section per row.
"""

from __future__ import annotations

import dataclasses
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


def variant_knobs(table: Registry, selector: str) -> Any:
    """The spec field holding the knobs of the row that field ``selector`` names: an instance of the row's
    ``knobs`` dataclass (None for a row without knobs). Left None, ``resolve_knobs`` fills in the row's
    defaults. The config gives each row with knobs a sub-section of its own, named after the row."""
    return field(default=None, metadata={"variants": table, "selector": selector})


def variants_field(spec: type) -> dataclasses.Field | None:
    """The ``variant_knobs`` field of the dataclass ``spec``, if it has one."""
    return next((f for f in dataclasses.fields(spec) if "variants" in f.metadata), None)


def resolve_knobs(spec: Any) -> None:
    """For a spec's ``__post_init__``: its ``variant_knobs`` field set to the chosen row's defaults when left
    None, and checked to be that row's knobs otherwise (an unknown name is the table's ValueError)."""
    slot = variants_field(type(spec))
    name = getattr(spec, slot.metadata["selector"])
    kind = slot.metadata["variants"].get(name).knobs
    knobs = getattr(spec, slot.name)
    if knobs is None and kind is not None:
        object.__setattr__(spec, slot.name, kind())
    elif knobs is not None and (kind is None or not isinstance(knobs, kind)):
        wanted = kind.__name__ if kind is not None else "none"
        raise ValueError(f"{slot.metadata['selector']} {name} takes {wanted} as its {slot.name}, got "
                         f"{type(knobs).__name__}")
