"""``{dataset: ...}`` sources: a split read with the ``datasets`` library, strictly offline.

Where the dataset is looked for, in order:

1. a local path: a directory of data files or a dataset repository's files (``load_dataset(dir)``,
   which finds the splits from file names and the README's configs), or a ``save_to_disk`` output;
2. the hub cache (``HF_HUB_CACHE``, or ``HF_HOME``/hub), where ``hf download --repo-type dataset ID``
   puts a repository's files: its snapshot directory is read as in 1;
3. the datasets cache (``HF_DATASETS_CACHE``), where an earlier online ``load_dataset(ID)`` left the
   prepared split.

Nothing is downloaded: the datasets and hub libraries are switched to offline mode for the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from gyre.config.data_schema import DatasetSource
from gyre.data.sources import DataError, RawRow


def read_dataset(source: DatasetSource) -> Iterator[RawRow]:
    """The rows of one split, as "ID[split]:row N"."""
    split = load_split(source)
    label = f"{source.dataset}[{source.split}]"
    for i, row in enumerate(split):
        yield RawRow(f"{label}:row {i}", dict(row))


def load_split(source: DatasetSource):
    """The ``datasets.Dataset`` a source names; a DataError saying what to do when it is not local."""
    try:
        import datasets  # noqa: F401 - a clear error below when the package is missing
    except ImportError:
        raise DataError(f"data source {{dataset: {source.dataset}}} needs the datasets package: "
                        "pip install datasets (or name the data files instead)") from None
    with _offline():
        local = Path(source.dataset).expanduser()
        if local.is_file():
            raise DataError(f"{{dataset: {source.dataset}}} is a file: list it in the data files directly "
                            "(.jsonl, .json, .parquet, .csv, .tsv); {dataset: ...} takes a directory or a Hub id")
        if local.exists():
            return _guarded(source, lambda: _load_local(local, source))
        snapshot = _hub_snapshot(source)
        if snapshot is not None:
            return _guarded(source, lambda: _load_dataset(str(snapshot), source))
        return _guarded(source, lambda: _load_dataset(source.dataset, source))


def cached_here(source: DatasetSource) -> bool:
    """Whether ``source`` is on this machine: a local path, or a Hub id in the hub cache (an id only in the
    datasets cache counts as absent: finding it there means preparing the split)."""
    return Path(source.dataset).expanduser().exists() or _hub_snapshot(source) is not None


def _load_local(path: Path, source: DatasetSource):
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        from datasets import DatasetDict, load_from_disk

        saved = load_from_disk(str(path))
        if not isinstance(saved, DatasetDict):
            return saved
        if source.split not in saved:
            raise DataError(f"{path} (saved with save_to_disk) has no split {source.split!r}; its splits: "
                            f"{', '.join(saved)}; set split to one of them")
        return saved[source.split]
    return _load_dataset(str(path), source)


def _load_dataset(path: str, source: DatasetSource):
    from datasets import load_dataset

    return load_dataset(path, name=source.name, split=source.split)


def _hub_snapshot(source: DatasetSource) -> Path | None:
    """The cached snapshot directory of a Hub dataset repository, or None when it is not cached."""
    if source.dataset.count("/") > 1:
        return None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source.dataset, repo_type="dataset", revision=source.revision,
                                      local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the hub cache (or not a repo id): try the datasets cache
        return None


def _guarded(source: DatasetSource, load):
    """``load()``, with the datasets library's errors turned into one paragraph naming the fix."""
    try:
        return load()
    except DataError:
        raise
    except ConnectionError:  # offline and in no local cache
        raise DataError(_not_cached(source)) from None
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; the message says which
        text = " ".join(str(exc).split())[:400]
        if "is not cached" in text or ("Couldn't find" in text and "/" in source.dataset):
            raise DataError(_not_cached(source)) from None
        raise DataError(f"data source {{dataset: {source.dataset}, name: {source.name}, split: {source.split}}} "
                        f"cannot be read offline: {type(exc).__name__}: {text}") from None


def _not_cached(source: DatasetSource) -> str:
    from datasets import config
    from huggingface_hub import constants

    return (f"dataset {source.dataset!r} is neither a local path nor in the local caches (hub cache "
            f"{constants.HF_HUB_CACHE}, datasets cache {config.HF_DATASETS_CACHE}); gyre reads datasets "
            f"offline. Fetch it once with `hf download --repo-type dataset {source.dataset}` (set HF_HOME or "
            "HF_HUB_CACHE to use another cache), or name a local directory or data files.")


@contextlib.contextmanager
def _offline():
    """Offline mode and no progress bars for the duration of one load (restored after)."""
    import datasets
    from huggingface_hub import constants

    saved = (datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE, not datasets.are_progress_bars_disabled())
    datasets.config.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, constants.HF_HUB_OFFLINE = saved[0], saved[1]
        if saved[2]:
            datasets.enable_progress_bars()
