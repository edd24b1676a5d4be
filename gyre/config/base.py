"""Shared building blocks of the config schema: strict models and validated value types."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

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
    """Base for every config section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_attribute_docstrings=True)


def attribute_docstrings(cls: type) -> dict[str, str]:
    """The docstrings written under the annotated attributes of ``cls``'s own class body, by name (what
    pydantic's ``use_attribute_docstrings`` reads for models, here for a plain dataclass)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a frozen build): the fields go undocumented, not broken
        return {}
    body = tree.body[0].body
    docs = {}
    for stmt, after in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


class SpecSection(StrictModel):
    """A config section declared by a spec dataclass (``section_from_spec``), which ``spec`` builds back."""

    _spec: typing.ClassVar[type]

    def spec(self, **run_fields: typing.Any) -> typing.Any:
        """The spec of this section's values, with the driver's ``run_field`` values added."""
        return self._spec(**{name: getattr(self, name) for name in type(self).model_fields}, **run_fields)


def section_from_spec(spec: type, name: str, module: str, doc: str | None = None) -> type[SpecSection]:
    """A strict config section whose keys are the fields of the dataclass ``spec``: same names, types and
    defaults; a ``knob``'s choices (a ``Registry``) become a Literal of its names and its bounds become
    constraints; ``run_field`` fields are left out. So a knob is declared once, on the spec, and the spec
    is built back from the section by field name (``SpecSection.spec``). ``doc`` defaults to the spec's."""
    hints = typing.get_type_hints(spec)
    docs = attribute_docstrings(spec)
    fields: dict[str, typing.Any] = {}
    for f in dataclasses.fields(spec):
        rules = dict(f.metadata)
        if "from_run" in rules:
            continue
        choices = rules.pop("choices", None)
        kind = Literal[choices.names] if choices is not None else hints[f.name]
        fields[f.name] = (kind, Field(f.default, description=docs.get(f.name), **rules))
    section = create_model(name, __base__=SpecSection, __module__=module, __doc__=doc or spec.__doc__, **fields)
    section._spec = spec
    return section
