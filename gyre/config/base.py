"""Shared building blocks of the config schema: strict models and validated value types."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

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

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
