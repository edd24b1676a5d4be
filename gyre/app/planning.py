"""``gyre check --plan-only``: the plan of a run for machines this one is not, e.g. a GPU cluster's run
planned from a laptop.

The plan needs, of the model, its shape (parameters, layers, KV heads, hidden size, vocabulary) and, of
the devices, their indices and memory. On the cluster the model directory and the local GPU give them.
From elsewhere the shape comes from ``--model-shape`` (a catalog size or a config.json), else the model
directory when it is here, else a size the model's name states (announced as a guess); one device's
memory from ``--device`` (a device class or GB), else ``cluster.device_memory_gb``, else no fit verdict.
The devices are the config's device lists, not counted (as with ``--address`` before joining).
Whatever this machine holds is still checked as ``gyre check`` checks it; what it lacks (model
directories, data files, reward function and environment files) is listed as not checked here, never
an error.
"""

from __future__ import annotations

import glob
import math
import re
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gyre.config.catalog import DEVICES, MODELS, ModelShape
from gyre.config.load import ConfigError
from gyre.models.hub import HubResolver
from gyre.models.loading import ModelPathError

PLAN_HINT = ("To plan a run for machines that hold the model and data (a cluster's shared storage) from this one, "
             "add --plan-only: it prints the plan and each role's memory estimate without them (--model-shape 7b, "
             "or the model's config.json, sets the shape; --device h100, or GB per device, the memory).")


@dataclass(frozen=True)
class Planning:
    """What ``gyre check`` was asked to plan with."""

    model_shape: str | None = None
    """--model-shape: a catalog size ("7b") or a model's config.json (the file, or its directory)."""
    device: str | None = None
    """--device: a device class ("h100") or one device's memory in GB ("80")."""


@dataclass
class NotHere:
    """What this machine lacks, as the config names it: left unchecked by the plan."""

    models: dict[str, str] = field(default_factory=dict)
    """config key -> the model path or Hub id that is neither a directory nor in the Hub cache here."""
    data: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    """config key (reward.domains.<name>, env.id) -> the reward function or environment files it names."""

    @property
    def tokenizer_here(self) -> bool:
        return not {"model.path", "model.tokenizer_path"} & set(self.models)

    @property
    def reads_data(self) -> bool:
        """The data stage runs: every source and file is here, and the tokenizer that reads the rows."""
        return self.tokenizer_here and not self.data and not self.files

    def describe(self) -> str:
        from gyre.models.hub import looks_like_hub_id

        parts = [f"Hub model {path} ({key}; not in the Hugging Face cache here)" if looks_like_hub_id(path)
                 else f"model directory {path} ({key})" for key, path in self.models.items()]
        if self.data:
            parts.append("data files " + ", ".join(self.data))
        parts += [f"{'environment' if key == 'env.id' else 'reward function'} file {file} ({key})"
                  for key, file in self.files.items()]
        if not self.reads_data and not self.data and not self.files:
            parts.append("the data rows and reward probes (the files are here, but the rows are read with the "
                         "model's tokenizer, which is not)")
        elif not self.reads_data and self.tokenizer_here:
            parts.append("the data rows and reward probes (they need every file above)")
        if not parts:
            return "planning mode: everything the config names is on this machine, and was checked"
        return ("not checked here (planning mode): " + "; ".join(parts) + ". gyre check on a machine that holds "
                "them checks them (gyre train does before it starts anything)")


class _HereOnly(HubResolver):
    """Resolves the model paths this machine holds, as ``gyre check`` does; records the others in
    ``absent`` and leaves them as written (a path on the cluster's storage, a Hub id cached there)."""

    def __init__(self, absent: dict[str, str]):
        super().__init__(echo=lambda _line: None)
        self.absent = absent

    def __call__(self, path: str, revision: str | None, key: str) -> str:
        if Path(path).expanduser().exists():  # a directory here: its errors are real ones
            return super().__call__(path, revision, key)
        try:
            return super().__call__(path, revision, key)
        except ModelPathError:
            self.absent[key] = path
            return path


def plan_run(cfg, planning: Planning, address: str | None, echo: Callable[[str], None]):
    """``gyre check``'s pre-flight for a run elsewhere: (the config resolved with what is here, the plan
    with each role's memory estimate, what is not here). Echoes the resolved config. ConfigError when the
    plan is impossible or does not fit, as ``gyre check``."""
    from gyre.app.preflight import resolve_paths
    from gyre.config.report import resolved_yaml

    if address:
        raise ConfigError("--plan-only joins no cluster: drop --address (or drop --plan-only to join the cluster "
                          "and count its devices)")
    flags = shape_flag(planning.model_shape), device_memory(cfg, planning.device)  # bad flags: before any output
    cfg = cfg.model_copy(deep=True)
    notes = []
    if cfg.cluster.address:
        notes.append(f"cluster.address={cfg.cluster.address} not joined (planning mode): the devices are the "
                     "config's device lists")
    if cfg.cluster.device == "auto":  # what auto finds on this machine says nothing of the run's machines
        cfg.cluster.device = "cuda"
        notes.append("cluster.device auto planned for GPUs (cluster.device=cpu plans a CPU run)")
    missing = NotHere()
    save_dtype = cfg.model.save_dtype
    cfg = resolve_paths(cfg, _HereOnly(missing.models))
    if "model.path" in missing.models:
        cfg.model.save_dtype = save_dtype  # auto is read from the model's files, on the machine that has them
    echo("# resolved configuration\n" + resolved_yaml(cfg))
    missing.data = [source for source in _sources(cfg) if not _source_here(source)]
    missing.files = _absent_files(cfg)
    plan = _preflight(cfg, *flags, missing)
    plan.notes.extend(notes)
    return cfg, plan, missing


def _preflight(cfg, flag_shape, device: tuple[float | None, str], missing: NotHere):
    """``preflight.preflight`` over what is here, and the memory estimate of the planned shape (``flag_shape``:
    --model-shape's, else found here) on devices of the planned size (``device``)."""
    from gyre.app.preflight import check_lora, check_models, context_note, fit_memory
    from gyre.config.derive import make_plan
    from gyre.rewards.registry import check_functions

    check_models(cfg, missing.models)
    if "model.path" not in missing.models:
        check_lora(cfg)
    for name, domain in cfg.reward.domains.items():
        if f"reward.domains.{name}" not in missing.files:
            check_functions(domain)
    plan = make_plan(cfg, "cpu" if cfg.cluster.device == "cpu" else "cuda", None)
    shape, shape_text, config_json = flag_shape or model_shape(cfg, missing.models)
    note = context_note(cfg, config_json) if config_json and config_json.is_file() else None
    if note:
        plan.notes.append(note)
    if shape is None:
        plan.notes.append(shape_text)
        return plan
    device_gb, device_text = device if plan.device_kind == "cuda" else (None, "a CPU run: no fit verdict")
    basis = (f"  {'model shape':<20} {shape_text}", f"  {'device memory':<20} {device_text}")
    return fit_memory(cfg, plan, shape, device_gb, basis)


def shape_flag(flag: str | None) -> tuple[ModelShape, str, Path | None] | None:
    """--model-shape as (the shape, where it came from, the config.json it was read from); ConfigError
    naming the sizes when it is neither a catalog size nor a config.json."""
    if not flag:
        return None
    sizes = ", ".join(MODELS)
    if flag.lower() in MODELS:
        shape = MODELS[flag.lower()]
        return shape, _describe(shape, f"--model-shape {flag}, the catalog's"), None
    path = Path(flag).expanduser()
    config_json = path / "config.json" if path.is_dir() else path
    if not config_json.is_file():
        raise ConfigError(f"--model-shape {flag}: neither a catalog size ({sizes}) nor a model's config.json (the "
                          "file, or a directory holding one)")
    try:
        shape = ModelShape.from_hf_config(config_json, name=flag)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"--model-shape {flag}: its config.json lacks a size gyre reads ({exc!r}); give the "
                          f"nearest catalog size instead ({sizes})") from None
    return shape, _describe(shape, f"--model-shape {flag}"), config_json


def model_shape(cfg, absent: dict[str, str]) -> tuple[ModelShape | None, str, Path | None]:
    """Without --model-shape: (the shape, where it came from, the config.json it was read from), from the
    model directory when it is here, else from the size the model's name states; no shape: why not."""
    if "model.path" not in absent:
        config_json = Path(cfg.model.path).expanduser() / "config.json"
        try:
            shape = ModelShape.from_hf_config(config_json, name=Path(cfg.model.path).name)
        except (OSError, KeyError, TypeError, ValueError) as exc:
            return None, f"no memory estimate: the model's config.json lacks a size gyre reads ({exc!r})", config_json
        return shape, _describe(shape, f"{config_json}"), config_json
    name = absent["model.path"]
    size, why = guess_size(name)
    if size is None:
        return None, (f"no memory estimate: model.path={name} is not on this machine and {why}; give --model-shape "
                      f"with a catalog size ({', '.join(MODELS)}) or the model's config.json"), None
    return MODELS[size], _describe(MODELS[size], f"guessed from the name {name}, which is not on this machine: "
                                                 "give --model-shape to be sure"), None


def _describe(shape: ModelShape, source: str) -> str:
    params = f"{shape.params / 1e9:.1f}B" if shape.params >= 1e8 else f"{shape.params / 1e6:.1f}M"
    return (f"{shape.name}: {params} parameters, {shape.layers} layers, {shape.kv_heads} KV heads "
            f"x {shape.head_dim}, hidden {shape.hidden_size} ({source})")


_SIZE = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)[bB](?![A-Za-z0-9])")
"""A size token in a model's name: "7B" in Qwen2.5-7B-Instruct, "0.5b"; not the "7B" of "8x7B" or the
"3B" of "A3B" (a mixture of experts, which no dense catalog shape describes)."""


def guess_size(name: str) -> tuple[str | None, str]:
    """(the catalog size ``name`` states, "") when it states exactly one the catalog has, else (None, why)."""
    found = sorted({f"{size}b" for size in _SIZE.findall(name)})
    if len(found) == 1 and found[0] in MODELS:
        return found[0], ""
    if not found:
        return None, "its name states no size"
    if len(found) > 1:
        return None, f"its name states several sizes ({', '.join(found)})"
    return None, f"its name states {found[0]}, a size the catalog lacks"


def device_memory(cfg, flag: str | None) -> tuple[float | None, str]:
    """(one device's memory in GB, where it came from); None when neither --device nor the config says."""
    classes = ", ".join(name for name in DEVICES if name != "cpu")  # the cpu class is the simulator's
    if flag:
        name = flag.strip().lower()
        if name in DEVICES and name != "cpu":
            return DEVICES[name].mem_gb, f"{DEVICES[name].mem_gb:g} GB per device (--device {flag})"
        try:
            gb = float(name.removesuffix("gb"))
        except ValueError:
            gb = math.nan
        if not (math.isfinite(gb) and gb > 0):
            raise ConfigError(f"--device {flag}: give a device class ({classes}) or one device's memory in GB, "
                              "e.g. --device 80")
        return gb, f"{gb:g} GB per device (--device {flag})"
    gb = cfg.cluster.device_memory_gb
    if gb:
        return gb, f"{gb:g} GB per device (cluster.device_memory_gb)"
    return None, (f"unknown here, so no fit verdict: give --device with a class ({classes}) or GB, or set "
                  "cluster.device_memory_gb")


def _sources(cfg) -> list:
    sources = list(cfg.data.train_files) + list(cfg.data.val_files) if cfg.data is not None else []
    return sources + (list(cfg.sft_warmup.train_files) if cfg.sft_warmup is not None else [])


def _source_here(source) -> bool:
    if isinstance(source, str):
        if any(ch in source for ch in "*?["):
            return bool(glob.glob(str(Path(source).expanduser()), recursive=True))
        return Path(source).expanduser().exists()
    from gyre.data.hub import cached_here

    return cached_here(source)


def _absent_files(cfg) -> dict[str, str]:
    """config key -> the reward function or environment files (``file.py:name``) it names that are not here."""
    from gyre.rewards.registry import function_spec

    named = {}
    for name, domain in cfg.reward.domains.items():
        if domain.model_role is None:
            spec, kwargs = function_spec(domain)
            named[f"reward.domains.{name}"] = [spec, kwargs.get("base")] + [t.function for t in domain.shaping]
    if cfg.env is not None:
        named["env.id"] = [cfg.env.id]
    absent = {}
    for key, targets in named.items():
        files = [t.rpartition(":")[0] for t in targets if t and t.rpartition(":")[0].endswith(".py")]
        lacking = [f for f in files if not Path(f).expanduser().is_file()]
        if lacking:
            absent[key] = ", ".join(lacking)
    return absent


@contextmanager
def suggest_planning(cfg):
    """A missing model or data file that ``gyre check`` reports also names planning mode, when the config
    names files this machine lacks (a cluster's config, checked from elsewhere)."""
    from gyre.data.prompts import DataError
    from gyre.rewards.base import RewardSpecError

    try:
        yield
    except (ModelPathError, DataError, RewardSpecError) as exc:
        models = (cfg.model.path, cfg.model.tokenizer_path, cfg.critic.model_path, cfg.teacher.model_path)
        if isinstance(exc, ModelPathError):  # (a Hub id cached here resolves: it raises none of "missing")
            lacking = any(p and not Path(p).expanduser().exists() for p in models)
        elif isinstance(exc, DataError):
            lacking = not all(_source_here(s) for s in _sources(cfg))
        else:
            lacking = bool(_absent_files(cfg))
        if exc.args and lacking:
            text = str(exc.args[0])
            exc.args = (f"{text}{'' if text.endswith('.') else '.'} {PLAN_HINT}", *exc.args[1:])
        raise
