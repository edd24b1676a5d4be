"""Put a local model directory into a Hugging Face Hub cache the way ``hf download`` lays it out:
``models--org--name/blobs/<hash>`` holding the bytes, ``snapshots/<commit>/<file>`` relative links to
them, ``refs/<branch or tag>`` holding a commit. Nothing can be downloaded in the tests, so they build
the cache by hand."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_model(cache: Path, repo_id: str, source: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """Add every file of ``source`` as snapshot ``commit`` (40 hex digits) of ``repo_id``; point each of
    ``refs`` at it. Returns the snapshot directory."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    blobs, snapshot = repo / "blobs", repo / "snapshots" / commit
    blobs.mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
