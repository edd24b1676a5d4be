"""The configuration reference, read from the schema itself: every key's dotted path, type, default, allowed
values and docstring. ``gyre config --describe KEY`` prints from it and the docs site generates its
configuration pages from it, so neither can drift from the code."""

from __future__ import annotations

import difflib
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from gyre.config.aliases import alias_for
from gyre.config.load import ConfigError, _model_in, _suggest

NAME = "<name>"
"""Stands for a free key in a path (a reward domain's name: reward.domains.<name>.type)."""
ITEM = "[]"
"""Marks the entries of a list of sections (reward.domains.<name>.shaping[].kind)."""


@dataclass(frozen=True)
class FieldDoc:
    """One key of a config schema, as the reference shows it."""

    path: str
    """Dotted path as a user writes it in YAML or an override (``rollout.async_ratio``)."""
    type: str
    """The value's type, readable (``float >= 0``, ``int > 0 | None``, ``section``)."""
    default: str
    """The default as YAML (``0.0``, ``null``, ``[0]``), or ``required``."""
    choices: tuple[str, ...]
    """The allowed values of a Literal type; empty for free values."""
    doc: str
    """The field's docstring."""
    section: bool
    """True for a nested section (its own keys follow it in the list)."""


def schema_for(pipeline: str | None) -> type[BaseModel]:
    """The config schema of ``gyre train`` (rlvr), ``gyre sft`` or ``gyre dpo``."""
    from gyre.config.dpo_schema import DPOJobConfig
    from gyre.config.schema import RLVRConfig
    from gyre.config.sft_schema import SFTJobConfig

    schemas = {"rlvr": RLVRConfig, "sft": SFTJobConfig, "dpo": DPOJobConfig}
    return schemas[pipeline or "rlvr"]


def field_docs(model: type[BaseModel], prefix: str = "", instance: BaseModel | None = None) -> list[FieldDoc]:
    """Every key of ``model`` and its nested sections, depth first, in declaration order. ``instance``: the
    section's own default, whose values win over the class's (gyre dpo's run.name is gyre-dpo)."""
    found = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        sub, step = _nested(field.annotation)
        own = getattr(instance, name) if instance is not None else _default(field)
        kind = "section" if sub and step == "" else _field_type(field)
        shown = "{...}" if isinstance(own, BaseModel) else _yaml(own)
        if step.startswith(".") and isinstance(own, dict) and own:  # sections by name: their names, not all keys
            shown = "{" + ", ".join(f"{key}: {{...}}" for key in own) + "}"
        found.append(FieldDoc(path, kind, shown, tuple(_choices(field.annotation)), (field.description or "").strip(),
                              sub is not None))
        if sub is not None:
            found.extend(field_docs(sub, f"{path}{step}.", own if isinstance(own, sub) else None))
    return found


def _nested(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The section a field holds and the path step to its keys: "" (X or X | None), ".<name>"
    (dict[str, X]) or "[]" (a list whose entries may be X)."""
    origin = typing.get_origin(annotation)
    if origin is dict:
        return _model_in(typing.get_args(annotation)[1]), f".{NAME}"
    if origin is list:
        return _model_in(typing.get_args(annotation)[0]), ITEM
    return _model_in(annotation), ""


def type_text(annotation: Any) -> str:
    """``Annotated[int, Gt(0)] | None`` -> ``int > 0 | None``; a Literal -> its values joined by |."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _bounded(type_text(args[0]), args[1:])
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_text(a) for a in args)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # read from a YAML list
        return f"list[{type_text(args[0])}]"
    if origin in (list, tuple, dict):
        inner = ", ".join("..." if a is Ellipsis else type_text(a) for a in args)
        return f"{origin.__name__}[{inner}]" if args else origin.__name__
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"  # a section inside a list or a union (field_docs names a section's own type)
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def _field_type(field: FieldInfo) -> str:
    """The type with the field's own constraints on its value, not on None: ``float > 1 | None``."""
    args = typing.get_args(field.annotation)
    if field.metadata and typing.get_origin(field.annotation) in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _bounded(type_text(a), field.metadata) for a in args)
    return _bounded(type_text(field.annotation), field.metadata)


def _bounded(kind: str, metadata: Any) -> str:
    """``float`` with Ge(0) and Le(1) -> ``float >= 0, <= 1``."""
    bounds = _bounds(metadata)
    return f"{kind} {', '.join(bounds)}" if bounds else kind


def _bounds(metadata: Any) -> list[str]:
    out = []
    for item in metadata:
        for inner in getattr(item, "metadata", [item]):  # a FieldInfo carries its constraints in .metadata
            for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
                if getattr(inner, attr, None) is not None:
                    out.append(f"{sign} {getattr(inner, attr)}")
    return out


def _choices(annotation: Any) -> list[str]:
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in typing.get_args(annotation)]
    return [c for arg in typing.get_args(annotation) for c in _choices(arg)]


def _default(field: FieldInfo) -> Any:
    return PydanticUndefined if field.is_required() else field.get_default(call_default_factory=True)


def _yaml(value: Any) -> str:
    if value is PydanticUndefined:
        return "required"
    text = yaml.safe_dump(to_jsonable_python(value), default_flow_style=True, width=10_000).strip()
    return text.removesuffix("...").strip()


def find(docs: list[FieldDoc], key: str) -> FieldDoc | None:
    """The key at dotted ``key``: a domain's own name may stand for <name>, and the reward short form
    (reward.type) for reward.domains.<name>.type."""
    wanted = _normal(key)
    for doc in docs:
        if doc.path == wanted or _matches(doc.path, wanted):
            return doc
    return None


def _normal(key: str) -> str:
    key = key.strip().strip(".").replace("[]", ITEM)
    head, _, rest = key.partition(".")
    if head == "reward" and rest and not rest.startswith("domains"):
        return f"reward.domains.{NAME}.{rest}"
    return key


def _matches(path: str, key: str) -> bool:
    mine, theirs = path.split("."), key.split(".")
    return len(mine) == len(theirs) and all(a == b or a == NAME for a, b in zip(mine, theirs))


def children(docs: list[FieldDoc], section: FieldDoc) -> list[FieldDoc]:
    """The keys directly inside ``section``."""
    depth = section.path.count(".")
    inside = [d for d in docs if d.path.startswith(section.path) and d.path != section.path]
    step = 2 if inside and inside[0].path[len(section.path):].startswith(f".{NAME}.") else 1
    return [d for d in inside if d.path.count(".") == depth + step]


def describe(key: str | None, pipeline: str | None = None) -> str:
    """What ``gyre config --describe KEY`` prints: a key's path, type, default, allowed values and
    docstring; a section's keys one per line; no key: the top-level sections. A key gyre moved shows the key
    it became. An unknown key is a ConfigError naming the closest valid key (another framework's name
    included)."""
    pipeline = pipeline or _pipeline_of_key(key)
    schema = schema_for(pipeline)
    docs = field_docs(schema)
    if not key:
        top = [d for d in docs if "." not in d.path]
        return f"{schema.__name__} (pipeline {pipeline or 'rlvr'}): its sections and keys\n" + _lines(top)
    doc = find(docs, key)
    moved = alias_for(key.strip()) if doc is None else None
    if moved is not None and moved[1].moved:  # a key of an earlier gyre: the entry of the key it became
        return f"{key.strip()} is now {moved[1].key}\n\n" + describe(moved[1].key, pipeline)
    if doc is None:
        where = "" if pipeline else "; --pipeline sft or dpo for those runs' keys"
        raise ConfigError(f"unknown config key {key!r}{_hint(schema, docs, key)} (`gyre config --describe` lists "
                          f"the sections{where})")
    text = [doc.path, f"  type: {doc.type}", f"  default: {doc.default}"]
    if doc.choices:
        text.append(f"  allowed: {', '.join(doc.choices)}")
    text += ["", *("  " + line for line in doc.doc.splitlines())]
    if doc.path.startswith(f"reward.domains.{NAME}."):
        text += ["", f"  (a single domain writes it {doc.path.replace(f'domains.{NAME}.', '')})"]
    if doc.section:
        text += ["", "keys:", _lines(children(docs, doc))]
    return "\n".join(text)


def _pipeline_of_key(key: str | None) -> str | None:
    """``sft.*`` and ``dpo.*`` live only in their own runs' schemas."""
    head = (key or "").partition(".")[0]
    return head if head in ("sft", "dpo") else None


def _lines(docs: list[FieldDoc]) -> str:
    width = max((len(d.path) for d in docs), default=0)
    return "\n".join(f"  {d.path:<{width}}  {d.type} = {d.default}  {first_sentence(d.doc)}" for d in docs)


def first_sentence(doc: str) -> str:
    text = " ".join(doc.split())
    end = re.search(r"(?<!e\.g)(?<!i\.e)\.\s", text)  # an abbreviation's dot ends no sentence
    return text if end is None else text[:end.start() + 1]


def _hint(schema: type[BaseModel], docs: list[FieldDoc], key: str) -> str:
    """The strict config's "did you mean" (aliases of other frameworks first), else the closest path."""
    parts = tuple(p for p in _normal(key).replace(NAME, "default").split(".") if p)
    hint = _suggest(schema, parts)
    if hint:
        return hint
    paths = [d.path for d in docs]
    close = difflib.get_close_matches(key, paths, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""
