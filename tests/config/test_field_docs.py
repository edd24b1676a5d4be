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


def _reached(model: type, seen: set) -> set:
    """The sections a schema holds, nested ones included (through unions, lists and dicts of sections)."""
    from gyre.config.reference import _nested

    seen.add(model)
    for field in model.model_fields.values():
        sub, _ = _nested(field.annotation)
        if sub is not None and sub not in seen:
            _reached(sub, seen)
    return seen


def test_every_key_of_every_pipeline_is_documented_in_the_reference():
    """From the roots a user writes (gyre train's, gyre sft's and gyre dpo's configs), every key reached,
    nested sections and list entries included, has a docstring; every section is strict; and no config
    section of gyre.config is left out of the reference (a section no root reaches is dead code)."""
    from gyre.config.reference import field_docs, schema_for

    reached: set = set()
    for pipeline in ("rlvr", "sft", "dpo"):
        root = schema_for(pipeline)
        undocumented = [d.path for d in field_docs(root) if not d.doc]
        assert not undocumented, f"{pipeline}: keys without a docstring: {undocumented}"
        reached |= _reached(root, set())
    assert all(issubclass(m, StrictModel) for m in reached), [m for m in reached if not issubclass(m, StrictModel)]
    for module in pkgutil.iter_modules(gyre.config.__path__):
        importlib.import_module(f"gyre.config.{module.name}")
    # the bases whose fields reach the reference through a subclass (AlgorithmConfig's knobs, the levers)
    bases = {b for m in reached for b in m.__mro__}
    orphans = sorted(c.__name__ for c in _sections(StrictModel) if c.__module__.startswith("gyre.config")
                     and c not in reached and c not in bases)
    assert not orphans, f"config sections no pipeline reaches: {orphans}"
