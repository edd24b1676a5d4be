"""Rows of the data sources a config names: files, directories, globs, and datasets read offline.

Each row comes with where it came from ("file:line" for line-based files, "file:row N" for Parquet,
"ID[split]:row N" for datasets), so every later error can name it. A source that yields no rows, a
glob that matches nothing, a directory with no data files, or a file that cannot be read is a
``DataError`` here, before anything starts.
"""

from __future__ import annotations

import csv
import glob
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.config.data_schema import DatasetSource, DataSource

FORMATS = (".jsonl", ".json", ".parquet", ".csv", ".tsv")
"""File suffixes gyre reads itself (anything ``datasets`` reads goes through a ``{dataset: ...}`` entry)."""
_HELD_OUT = ("test", "val", "valid", "validation", "dev", "eval")


class DataError(ValueError):
    """A dataset file or row is unusable; the message names the file and line (or row)."""


@dataclass
class RawRow:
    where: str
    """"file:line" for JSONL and CSV (1-based lines), "file:row N" for Parquet and JSON arrays and
    "ID[split]:row N" for datasets (0-based rows)."""
    data: dict[str, Any]


def read_sources(sources: Iterable[DataSource]) -> Iterator[RawRow]:
    """Every row of every source, in order."""
    for source in sources:
        if isinstance(source, DatasetSource):
            from gyre.data.hub import read_dataset

            yield from _non_empty(read_dataset(source), source.dataset)
            continue
        saved = _saved_dataset(source)
        if saved is not None:
            from gyre.data.hub import read_dataset

            yield from _non_empty(read_dataset(saved), source)
            continue
        for path in expand(source):
            yield from _non_empty(read_rows(path), str(path))


def _saved_dataset(entry: str) -> DatasetSource | None:
    """A plain path to a ``save_to_disk`` folder, as the dataset source it is: a saved split as a whole, or
    a saved DatasetDict's only split (with several, the split to read is the user's choice: an error)."""
    path = Path(entry).expanduser()
    if any(ch in entry for ch in "*?[") or not path.is_dir():
        return None
    if (path / "state.json").is_file():
        return DatasetSource(dataset=entry)
    index = path / "dataset_dict.json"
    if not index.is_file():
        return None
    try:
        splits = list(json.loads(index.read_text(encoding="utf-8"))["splits"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{index} (a save_to_disk DatasetDict's index) cannot be read: {exc}") from None
    if len(splits) != 1:
        raise DataError(f"{path} is a dataset saved with save_to_disk holding the splits {', '.join(splits)}; "
                        f"say which to read: {{dataset: {entry}, split: {splits[0] if splits else 'train'}}}")
    return DatasetSource(dataset=entry, split=splits[0])


def _non_empty(rows: Iterator[RawRow], what: str) -> Iterator[RawRow]:
    empty = True
    for row in rows:
        empty = False
        yield row
    if empty:
        raise DataError(f"data source {what} holds no rows; check that the file was written completely, or "
                        "remove it from the data files")


def expand(entry: str) -> list[Path]:
    """The files a ``train_files`` string names: the file itself, a directory's data files (sorted, not
    recursive), or a glob's matches (sorted; ``**`` descends)."""
    if any(ch in entry for ch in "*?["):
        matches = sorted(Path(m) for m in glob.glob(str(Path(entry).expanduser()), recursive=True))
        files = [m for m in matches if m.is_file()]
        if not files:
            raise DataError(f"the glob {entry} matches no file; check the pattern (\"**\" descends into "
                            "subdirectories) and the directory it starts from")
        return files
    path = Path(entry).expanduser()
    if path.is_dir():
        return _directory_files(path)
    if not path.exists():
        raise DataError(f"data file {entry} does not exist")
    return [path]


def _directory_files(path: Path) -> list[Path]:
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in FORMATS and not p.name.startswith("."))
    if not files:
        raise DataError(f"directory {path} holds no data files ({', '.join(FORMATS)}); subdirectories are not "
                        f"read: name the files or a glob such as {path}/**/*.parquet, or use {{dataset: {path}, "
                        "split: train}} to read a dataset repository's layout")
    held_out = [p.name for p in files if p.stem.lower().split("-")[0].split("_")[0] in _HELD_OUT]
    if held_out and len(held_out) < len(files):
        raise DataError(f"directory {path} mixes held-out split files ({', '.join(held_out)}) with the others; "
                        "name the training files or a glob, or use {dataset: " + str(path) + ", split: train}")
    return files


def read_rows(path: str | Path) -> Iterator[RawRow]:
    """Rows of one data file, by its suffix."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file {path} does not exist" + (" (it is a directory)" if p.is_dir() else ""))
    readers = {".parquet": _parquet_rows, ".csv": _csv_rows, ".tsv": _csv_rows, ".jsonl": _jsonl_rows,
               ".json": _json_rows}
    reader = readers.get(p.suffix.lower())
    if reader is None:
        raise DataError(f"data file {path}: unsupported format {p.suffix!r}; use .jsonl, .json, .parquet, .csv "
                        "or .tsv, or a {dataset: ...} entry for anything the datasets library reads")
    try:
        yield from reader(p)
    except PermissionError as exc:
        raise DataError(f"data file {path} cannot be read ({exc.strerror}); give this user read access") from None


def _parquet_rows(p: Path) -> Iterator[RawRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(p)
    except PermissionError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"data file {p} is not a readable Parquet file: {exc}") from None
    for i, row in enumerate(table.to_pylist()):
        yield RawRow(f"{p}:row {i}", row)


def _jsonl_rows(p: Path) -> Iterator[RawRow]:
    with p.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = _decode(raw, p, lineno)
            if not line.strip():
                continue
            # A whole JSON array in a .jsonl file fails on its first line: say where arrays go.
            hint = "; a .jsonl file has one object per line, a JSON array belongs in a .json file" \
                if lineno == 1 and line.lstrip().startswith("[") else ""
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}:{lineno}: invalid JSON ({exc.msg}){hint or '; each line must be one JSON object'}"
                                ) from None
            if not isinstance(row, dict):
                raise DataError(f"{p}:{lineno}: expected a JSON object, got {type(row).__name__}{hint}")
            yield RawRow(f"{p}:{lineno}", row)


def _json_rows(p: Path) -> Iterator[RawRow]:
    """A .json file: an array of objects, or JSON Lines under a .json name."""
    with p.open("rb") as fh:
        head = fh.read(4096).lstrip()
    if not head.startswith(b"["):
        yield from _jsonl_rows(p)
        return
    try:
        rows = json.loads(p.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise DataError(f"{p}: not UTF-8 text; save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{p}: invalid JSON at line {exc.lineno} ({exc.msg})") from None
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{p}:row {i}: expected a JSON object, got {type(row).__name__}")
        yield RawRow(f"{p}:row {i}", row)


def _csv_rows(p: Path) -> Iterator[RawRow]:
    """CSV (or TSV) with a header line; every value is text. A UTF-8 byte-order mark is skipped."""
    try:
        with p.open(encoding="utf-8-sig", newline="") as fh:
            reader = csv.DictReader(fh, delimiter="\t" if p.suffix.lower() == ".tsv" else ",")
            for row in reader:
                if None in row:  # more cells than header names
                    raise DataError(f"{p}:{reader.line_num}: {len(row[None]) + len(reader.fieldnames)} cells, but the "
                                    f"header names {len(reader.fieldnames)} columns; quote cells that hold commas")
                yield RawRow(f"{p}:{reader.line_num}", dict(row))
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); save the file as UTF-8 "
                        "(e.g. iconv -f latin1 -t utf-8)") from None
    except csv.Error as exc:
        raise DataError(f"{p}: not a readable CSV file ({exc})") from None


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                        "save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None
