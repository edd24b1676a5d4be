"""Model paths that name a Hugging Face Hub id, resolved from the local Hugging Face cache.

TRL and verl users write ``model.path: Qwen/Qwen2.5-0.5B-Instruct``. gyre never downloads during a run
(clusters are often offline, and every node would fetch at once), so the driver resolves such an id
once, from the local cache, to its snapshot directory, and every actor loads that directory. The cache
is where ``hf download`` puts models: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gyre.models.checks import ModelPathError

_SHORT_COMMIT = re.compile(r"^[0-9a-f]{7,39}$")


def hub_cache_dir() -> Path:
    """The Hub cache as huggingface_hub computes it, read from the environment now (huggingface_hub
    fixes its own value when it is first imported, before a test or a launcher may set the variable)."""
    env = os.environ
    default_home = os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                                "huggingface")
    home = env.get("HF_HOME") or default_home
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def looks_like_hub_id(text: str) -> bool:
    """``name`` or ``org/name`` as the Hub spells repository ids (no leading ``/``, ``~`` or ``.``)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def cached_repo_of(path: str | Path) -> tuple[str, str] | None:
    """(repo id, commit) when ``path`` is a snapshot directory in a Hub cache, else None."""
    p = Path(path)
    if p.parent.name != "snapshots" or not p.parent.parent.name.startswith("models--"):
        return None
    return p.parent.parent.name.removeprefix("models--").replace("--", "/"), p.name


def resolve_model_path(path: str, revision: str | None = None, key: str = "model.path") -> str:
    """The local directory that ``path`` names: itself when it exists (a directory of that name wins
    over a Hub id), else the snapshot of the Hub id ``path`` at ``revision`` (default: main) in the
    local cache. Raises ModelPathError naming the command that fetches a model not in the cache."""
    local = Path(path).expanduser()
    if local.exists():
        if revision is not None and cached_repo_of(local.resolve()) is None:
            raise ModelPathError(
                f"{key}={path!r} is a local directory, so model.revision={revision!r} has nothing to select (a "
                "revision picks a snapshot of a Hub id in the Hugging Face cache). Remove model.revision, or set "
                f"{key} to the model's Hub id.")
        return str(local.resolve())
    if not looks_like_hub_id(path):
        raise ModelPathError(missing_model_message(path, key))
    return str(cached_snapshot(path, revision, key))


def cached_snapshot(repo_id: str, revision: str | None, key: str) -> Path:
    """The snapshot directory of ``repo_id`` at ``revision`` (a branch, tag or commit; a unique commit
    prefix also works) in the local cache; nothing is fetched."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    snapshots = _repo_dir(cache, repo_id) / "snapshots"
    if revision and _SHORT_COMMIT.match(revision) and snapshots.is_dir():
        found = [d for d in snapshots.iterdir() if d.name.startswith(revision)]
        if len(found) == 1:
            return found[0]
    raise ModelPathError(_not_cached_message(repo_id, revision, key, cache))


def missing_model_message(path: str | Path, key: str) -> str:
    """Why ``path`` (absent here) cannot be loaded and what to do: a Hub id is fetched into the cache
    with ``hf download``; a local path can be filled with a small model of gyre's own."""
    if looks_like_hub_id(str(path)):
        return _not_cached_message(str(path), None, key, hub_cache_dir())
    return (f"{key}={str(path)!r} does not exist. Point it at a local Hugging Face model directory or a Hub id "
            f"in the local Hugging Face cache, or create a small model there with: gyre init-model --preset tiny "
            f"--out {path}")


def download_command(repo_id: str, revision: str | None = None) -> str:
    """The command that puts ``repo_id`` into the local cache."""
    return f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")


def _repo_dir(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def _not_cached_message(repo_id: str, revision: str | None, key: str, cache: Path) -> str:
    command = download_command(repo_id, revision)
    fetch = (f"`{command}` (older huggingface_hub: `huggingface-cli download "
             f"{command.removeprefix('hf download ')}`)")
    held = _cached_revisions(_repo_dir(cache, repo_id))
    if held:
        return (f"{key}={repo_id!r}: the Hugging Face cache at {cache} holds {repo_id} ({held}) but not revision "
                f"{revision or 'main'!r}. Set model.revision to one of those, or fetch that revision once with "
                f"{fetch}; gyre never downloads during a run.")
    return (f"{key}={repo_id!r} is neither a local directory nor a model in the Hugging Face cache at {cache}. "
            f"gyre never downloads during a run: fetch the model once with {fetch}, which fills that cache (it "
            f"follows HF_HUB_CACHE and HF_HOME, as gyre does), or point {key} at a local model directory.")


def _cached_revisions(repo: Path) -> str:
    """'main -> 0123abc, v1 -> 89abcde; snapshots 0123abc, 89abcde' for a repo folder of the cache."""
    refs_dir, snaps_dir = repo / "refs", repo / "snapshots"
    refs = []
    if refs_dir.is_dir():
        for ref in sorted(p for p in refs_dir.rglob("*") if p.is_file()):
            commit = ref.read_text(errors="replace").strip()
            refs.append(f"{ref.relative_to(refs_dir).as_posix()} -> {commit[:7]}")
    snaps = sorted(d.name[:7] for d in snaps_dir.iterdir() if d.is_dir()) if snaps_dir.is_dir() else []
    parts = [", ".join(refs)] if refs else []
    if snaps:
        parts.append("snapshots " + ", ".join(snaps))
    return "; ".join(parts)


@dataclass(frozen=True)
class HubPin:
    """A Hub id as a run's config named it, and the cached commit it resolved to when the run started."""

    repo_id: str
    revision: str | None
    """The revision the config asked for (None: main)."""
    commit: str
    """The snapshot that revision pointed to then."""


class HubResolver:
    """``resolve_model_path`` for every model key of a run, remembering what each Hub id resolved to
    (``resolved``, recorded in run.json when the run starts). With ``pins`` (a resumed run's record), an id
    the config still names the same way resolves to the commit the run started from, even if its branch
    has moved in the cache since: a run resumes with the model, tokenizer and reference it began with."""

    def __init__(self, pins: Mapping[str, HubPin] | None = None, echo: Callable[[str], None] = print):
        self.pins = dict(pins or {})
        self.echo = echo
        self.resolved: dict[str, HubPin] = {}
        """config key -> what its Hub id resolved to (keys holding local directories are left out)."""

    def __call__(self, path: str, revision: str | None, key: str) -> str:
        local = Path(path).expanduser().exists()
        pin = self.pins.get(key)
        if not local and pin is not None and (pin.repo_id, pin.revision) == (path, revision):
            resolved = pinned_snapshot(pin, key)
            self.echo(f"{key}={path}: commit {pin.commit[:12]}, the snapshot this run started from (run.json)")
        else:
            resolved = resolve_model_path(path, revision, key)
        cached = cached_repo_of(resolved)
        if not local and cached is not None:
            self.resolved[key] = HubPin(path, revision, cached[1])
        return resolved


def pinned_snapshot(pin: HubPin, key: str) -> str:
    """The cached snapshot of ``pin``'s commit; a ModelPathError saying how to get it back when it is gone."""
    try:
        return str(cached_snapshot(pin.repo_id, pin.commit, key))
    except ModelPathError:
        cache = hub_cache_dir()
        held = _cached_revisions(_repo_dir(cache, pin.repo_id))
        raise ModelPathError(
            f"{key}={pin.repo_id!r}: this run started from commit {pin.commit[:12]} of {pin.repo_id} (recorded in its "
            f"run.json), and the Hugging Face cache at {cache} no longer holds that snapshot"
            f"{f' (it holds {held})' if held else ''}. Resume with the same model by fetching it again: "
            f"`{download_command(pin.repo_id, pin.commit)}`; or start a new run (--overwrite) from the model the "
            "cache holds now.") from None
