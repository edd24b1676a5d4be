"""Load a run config from YAML plus ``key.path=value`` overrides, with errors that say what to change."""

from __future__ import annotations

import difflib
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gyre.config.aliases import alias_for, describe, moved_close_to
from gyre.config.schema import RLVRConfig


class ConfigError(ValueError):
    """A configuration problem the user must fix; the message names the key and the remedy."""


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = (),
                schema: type[BaseModel] | None = RLVRConfig):
    """Read ``path`` (YAML; None starts empty), apply ``overrides`` ("a.b=value", values parsed as YAML)
    and validate against ``schema`` (a run config; ``gyre.config.sft_schema.SFTJobConfig`` for ``gyre sft``;
    None: the schema the config's own ``pipeline`` key names, as ``gyre check`` reads any config)."""
    raw: dict[str, Any] = read_yaml(Path(path)) if path is not None else {}
    for item in overrides:
        apply_override(raw, item)
    return validate_config(raw, source=str(path) if path else "config", schema=schema or schema_of(raw))


def schema_of(raw: dict[str, Any]) -> type[BaseModel]:
    """The config schema of the pipeline ``raw`` names (rlvr when it names none)."""
    from gyre.config.dpo_schema import DPOJobConfig
    from gyre.config.sft_schema import SFTJobConfig

    return {"sft": SFTJobConfig, "dpo": DPOJobConfig}.get(raw.get("pipeline"), RLVRConfig)


def validate_config(raw: dict[str, Any], source: str = "config", schema: type[BaseModel] = RLVRConfig):
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, schema, source)) from None


def read_yaml(path: Path) -> dict[str, Any]:
    """A config file's sections as plain data; a ConfigError naming the line when it is not YAML."""
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the file as "
                          "UTF-8") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader that refuses duplicate keys
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}:{exc.line}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{_yaml_where(path, exc)}: not valid YAML ({_yaml_problem(exc)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections (run:, model:, ...), not {type(data).__name__}")
    return data


class _DuplicateKey(Exception):
    def __init__(self, message: str, line: int):
        super().__init__(message)
        self.line = line


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key written twice in one mapping is an error (PyYAML keeps the
    last silently: two ``run:`` sections would lose the first one's settings)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *anchor``: explicit keys override it
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, typing.Hashable) and key in seen:
                raise _DuplicateKey(f"key {key!r} appears twice in one section (lines {seen[key]} and {line}): "
                                    "YAML keeps only the last, so merge them into one", line)
            if isinstance(key, typing.Hashable):
                seen[key] = line
        return super().construct_mapping(node, deep)


def _yaml_where(source: object, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(source)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The one-line reason (PyYAML's message spans several lines with a caret drawing)."""
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    return "; ".join(p for p in parts if p) or str(exc).splitlines()[0]


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Set ``raw[a][b] = value`` for ``item == "a.b=value"``; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value")
    key, _, text = item.partition("=")
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot parse the value of override {item!r} as YAML ({_yaml_problem(exc)}); quote "
                          "strings that hold YAML syntax, e.g. key='a: b'") from None
    set_key(raw, parts, value, f"override {item!r}")


def set_key(raw: dict[str, Any], path: str | list[str], value: Any, what: str = "") -> None:
    """``raw[a][b] = value`` for the dotted ``path`` "a.b" (or its parts), making sections on the way."""
    parts = path.split(".") if isinstance(path, str) else path
    node = raw
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{what or '.'.join(parts)}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


_SHORT_REWARD = ("reward", "domains", "default")


def _shown(path: str) -> str:
    """The single reward domain is written ``reward.type``, stored as ``reward.domains.default.type``."""
    full = ".".join(_SHORT_REWARD)
    if path == full:
        return "reward"
    return "reward." + path[len(full) + 1:] if path.startswith(full + ".") else path


def format_validation_error(exc: ValidationError, root: type[BaseModel], source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        dotted = _shown(".".join(loc)) or "(top level)"
        if err["type"] == "extra_forbidden":
            valid = _valid_keys(root, loc[:-1])
            hint = _suggest(root, loc, err.get("input"))
            lines.append(f"  - unknown key {dotted!r}{hint} (valid keys here: {', '.join(sorted(valid))})")
        elif err["type"] == "missing":
            lines.append(f"  - missing required key {dotted!r}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            # A whole section as the input (a cross-field check) would bury the message: leave it out.
            shown = "" if isinstance(got, (dict, list)) else f" (got {str(got)[:120]!r})"
            lines.append(f"  - {dotted}: {msg}{shown}")
    return "\n".join(lines)


def _suggest(root: type[BaseModel], loc: tuple[str, ...], value: Any = None) -> str:
    """A "did you mean" hint: gyre's key for another framework's name (``aliases``), else the same key
    in a nested section (exact, so it beats a spelling neighbour: policy.lr is policy.optimizer.lr, not
    policy.lora), else a close spelling here, else the new place of a close spelling of a moved key."""
    foreign = _foreign_hint(root, _shown(".".join(loc)), value)
    if foreign:
        return foreign
    parent, key = loc[:-1], loc[-1]
    model = _model_at(root, parent)
    nested = [p for p in _all_paths(model) if p[-1] == key] if model else []
    if nested:
        return f"; did you mean {_shown('.'.join(parent + nested[0]))!r}?"
    valid = _valid_keys(root, parent)
    guess = difflib.get_close_matches(key, valid, n=1, cutoff=0.6) or [k for k in valid if k.startswith(key)][:1]
    if guess:
        return f"; did you mean {_shown('.'.join(parent + (guess[0],)))!r}?"
    moved = moved_close_to(".".join(loc))  # a misspelt key of an earlier gyre: where that key went
    return f"; did you mean {moved.key!r}?" if moved is not None else ""


def _foreign_hint(root: type[BaseModel], path: str, value: Any) -> str:
    """Another framework's key at ``path``: gyre's key for it. For an unknown section (verl's
    actor_rollout_ref...), gyre's key for each of its entries: an alias, else a key of the same name."""
    pipeline = _pipeline_of(root)
    match = alias_for(path, pipeline)
    if match is not None:
        return f"; did you mean {match[1].key!r}? {describe(*match)}"
    if not isinstance(value, dict):
        return ""
    found = []
    for leaf in _leaves(value, path):
        match = alias_for(leaf, pipeline)
        if match is not None:
            found.append(f"{leaf} is {match[1].key!r} {describe(*match)}")
            continue
        same = [p for p in _all_paths(root) if p[-1] == leaf.rpartition(".")[2]]
        if same:
            found.append(f"{leaf} is {'.'.join(same[0])!r}")
    return "; in gyre, " + ", ".join(found) if found else ""


def _pipeline_of(root: type[BaseModel]) -> str | None:
    """The ``pipeline`` a config schema is for (rlvr, sft, dpo)."""
    field = root.model_fields.get("pipeline")
    return field.default if field is not None else None


def _leaves(value: dict, prefix: str) -> list[str]:
    """Dotted paths of the non-mapping values under ``value``."""
    paths = []
    for key, item in value.items():
        path = f"{prefix}.{key}"
        paths.extend(_leaves(item, path) if isinstance(item, dict) and item else [path])
    return paths


def _all_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, field in model.model_fields.items():
        paths.append(prefix + (name,))
        sub = _model_in(field.annotation)
        if sub is not None:
            paths.extend(_all_paths(sub, prefix + (name,)))
    return paths


def _valid_keys(root: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    model = _model_at(root, loc)
    return list(model.model_fields) if model else []


def _model_at(root: type[BaseModel], loc: tuple[str, ...]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    parts = iter(loc)
    for part in parts:
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        if typing.get_origin(field.annotation) is dict:  # dict[str, Model]: the next part is a free key
            model = _model_in(typing.get_args(field.annotation)[1])
            next(parts, None)
        else:
            model = _model_in(field.annotation)
    return model


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class inside ``X``, ``X | None`` or ``Optional[X]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None
