"""Shared building blocks of the config schema: strict models and validated value types."""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import sys
import typing
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model, model_validator

from gyre.algos.tables import variants_field

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def parse_devices(value: object) -> tuple[int, ...]:
    """Accept ``[0, 1]``, ``3`` or the declarative range syntax ``"0-3,6"`` (no ``eval``)."""
    if isinstance(value, bool):
        raise ValueError("a device list must be integers, not a boolean")
    if isinstance(value, int):
        items: list[int] = [value]
    elif isinstance(value, str):
        items = []
        for part in value.split(","):
            match = _RANGE.match(part)
            if not match:
                raise ValueError(f"cannot read device list {value!r}: use a list like [0, 1] or ranges like '0-3,6'")
            lo = int(match.group(1))
            hi = int(match.group(2)) if match.group(2) is not None else lo
            if hi < lo:
                raise ValueError(f"device range {part.strip()!r} runs backwards")
            items.extend(range(lo, hi + 1))
    elif isinstance(value, (list, tuple)):
        items = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                raise ValueError(f"device {item!r} is not an integer index")
            items.append(item)
    else:
        raise ValueError(f"cannot read device list {value!r}")
    if not items:
        raise ValueError("a device list cannot be empty")
    if any(i < 0 for i in items):
        raise ValueError(f"device indices must be >= 0, got {items}")
    if len(set(items)) != len(items):
        raise ValueError(f"device list {items} names a device twice")
    return tuple(items)


DeviceList = Annotated[tuple[int, ...], BeforeValidator(parse_devices)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
UnitFloat = Annotated[float, Field(ge=0, le=1)]


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, values are validated on assignment, and a
    number must be finite (``.inf`` and ``.nan`` are YAML floats, never a meaningful setting)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True,
                              allow_inf_nan=False)


def attribute_docstrings(cls: type) -> dict[str, str]:
    """The docstrings written under the annotated attributes of ``cls``'s own class body, by name (what
    pydantic's ``use_attribute_docstrings`` reads for models, here for a plain dataclass)."""
    node = _class_nodes(cls.__module__).get(cls.__qualname__)
    if node is None:  # no source (a frozen build): the fields go undocumented, not broken
        return {}
    docs = {}
    for stmt, after in zip(node.body, node.body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


@functools.cache
def _class_nodes(module: str) -> dict[str, ast.ClassDef]:
    """The top-level classes of ``module``'s source by name, parsed once per module (a table module declares
    a dataclass per variant; ``inspect.getsource`` would parse the file again for each)."""
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module]))
    except (OSError, TypeError, KeyError):
        return {}
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


class SpecSection(StrictModel):
    """A config section declared by a spec dataclass (``section_from_spec``), which ``spec`` builds back."""

    # Its fields carry the spec's docstrings as descriptions; pydantic's search for the source of a class that
    # create_model made walks every frame of the import (half of `gyre config`'s start-up time).
    model_config = ConfigDict(use_attribute_docstrings=False)
    _spec: typing.ClassVar[type]
    _keys: typing.ClassVar[tuple[str, ...]] = ()
    """The spec's fields that are keys of this section (its config-only keys and sub-sections are not)."""
    _variants: typing.ClassVar[tuple[str, str] | None] = None
    """(the spec's ``variant_knobs`` field, the field that names the variant), when it has one."""

    def spec(self, **run_fields: typing.Any) -> typing.Any:
        """The spec of this section's values (with the chosen variant's sub-section as its knobs), and the
        driver's ``run_field`` values added."""
        values = {name: getattr(self, name) for name in self._keys}
        if self._variants is not None:
            slot, selector = self._variants
            chosen = getattr(self, selector)
            values[slot] = getattr(self, chosen).spec() if chosen in type(self).model_fields else None
        return self._spec(**values, **run_fields)

    @model_validator(mode="after")
    def _spec_checks(self) -> SpecSection:
        # The spec's own checks (a dataclass's __post_init__) are the section's: a bad combination of knobs is
        # a config error naming the section, not a crash when the driver builds the spec.
        self.spec()
        return self


def _keys_of(spec: type) -> dict[str, typing.Any]:
    """The config keys of the dataclass ``spec`` (``run_field`` and ``variant_knobs`` fields left out), as
    pydantic field definitions: same names, types, defaults and docstrings; a ``knob``'s choices (a
    ``Registry``) become a Literal of its names and its bounds become constraints."""
    hints = typing.get_type_hints(spec)
    docs = attribute_docstrings(spec)
    fields: dict[str, typing.Any] = {}
    for f in dataclasses.fields(spec):
        rules = dict(f.metadata)
        if "from_run" in rules or "variants" in rules:
            continue
        choices = rules.pop("choices", None)
        kind = Literal[choices.names] if choices is not None else hints[f.name]
        fields[f.name] = (kind, Field(f.default, description=docs.get(f.name), **rules))
    return fields


def section_from_spec(spec: type, name: str, module: str, doc: str | None = None,
                      config_keys: type | None = None) -> type[SpecSection]:
    """A strict config section whose keys are the fields of the dataclass ``spec`` (``_keys_of``), so a knob
    is declared once, on the spec, and the spec is built back from the section by field name
    (``SpecSection.spec``). ``config_keys``: a dataclass of keys the config reads but the spec does not
    carry, placed after the spec's. A ``variant_knobs`` field becomes one sub-section per row of its table
    that has knobs, named after the row and generated from its knobs dataclass; so a new variant changes no
    config file. ``doc`` defaults to the spec's."""
    fields = _keys_of(spec)
    keys = tuple(fields)
    if config_keys is not None:
        fields.update(_keys_of(config_keys))
    slot = variants_field(spec)
    if slot is not None:
        table, selector = slot.metadata["variants"], slot.metadata["selector"]
        for row in table.names:
            knobs = table.get(row).knobs
            if knobs is None:
                continue
            if row in fields:
                raise TypeError(f"{spec.__name__}: {table.kind} {row!r} would hide the key of the same name")
            sub = _module_level(section_from_spec(knobs, f"{knobs.__name__}Section", module))
            about = f"{inspect.cleandoc(knobs.__doc__ or '')} Its keys apply when {selector} is {row}."
            fields[row] = (sub, Field(sub(), description=about))
    section = create_model(name, __base__=SpecSection, __module__=module, __doc__=doc or spec.__doc__, **fields)
    section._spec, section._keys = spec, keys
    section._variants = (slot.name, slot.metadata["selector"]) if slot is not None else None
    return section


def _module_level(section: type[SpecSection]) -> type[SpecSection]:
    """``section`` as an attribute of its module, where pickle looks a class up by name (a config crosses
    process boundaries pickled; a class only create_model holds cannot be found again)."""
    home = sys.modules[section.__module__]
    if getattr(home, section.__name__, section) is not section:
        raise TypeError(f"{section.__module__}.{section.__name__} exists already: a generated section needs its name")
    setattr(home, section.__name__, section)
    return section
