"""Every key a user can write is documented: each field of each config section has a docstring (pydantic
reads it as the field's description; the policy-loss knobs take theirs from PolicyLossSpec)."""

import importlib
import pkgutil

import gyre.config
from gyre.config.base import StrictModel


def _sections(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_sections(sub)]
    return found


def test_every_config_field_has_a_docstring():
    for module in pkgutil.iter_modules(gyre.config.__path__):
        importlib.import_module(f"gyre.config.{module.name}")
    sections = [c for c in _sections(StrictModel) if c.__module__.startswith("gyre.")]
    assert len(sections) > 30
    missing = sorted({f"{c.__module__}.{c.__name__}.{name}" for c in sections
                      for name, field in c.model_fields.items() if not (field.description or "").strip()})
    assert not missing, "fields without a docstring:\n" + "\n".join(missing)
