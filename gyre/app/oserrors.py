"""A file-system failure while writing a command's outputs, as one paragraph naming the path and the fix.

Where ``train``, ``export`` or ``init-model`` write (a run directory, an export folder, a new model) may be a
file, read-only, or on a full disk; the operating system's error says so in its errno. Those are the
user's to fix, so they end the command with exit code 2 and this text instead of a traceback.
"""

from __future__ import annotations

import errno

_FIXES = {
    errno.ENOSPC: "the disk is full: free space there, or choose an output directory on another disk",
    errno.EDQUOT: "the disk quota is used up: free space, or choose an output directory elsewhere",
    errno.EACCES: "this user may not write there: choose a writable output directory, or change its permissions",
    errno.EPERM: "this user may not write there: choose a writable output directory, or change its permissions",
    errno.EROFS: "the file system is read-only: choose an output directory on a writable one",
    errno.ENOTDIR: "a file stands where a directory is needed: choose another output path, or move that file",
    errno.EEXIST: "a file stands where a directory is needed: choose another output path, or move that file",
    errno.EISDIR: "a directory stands where a file is needed: choose another output path",
}


def write_failure(exc: OSError) -> str | None:
    """The paragraph for ``exc`` when it is a failure to write a path the user chose; None for any other
    OSError (a bug or a network fault, which keeps its traceback)."""
    fix = _FIXES.get(exc.errno)
    if fix is None:
        return None
    where = f" {exc.filename}" if exc.filename else ""
    return f"cannot write{where}: {exc.strerror or type(exc).__name__}; {fix}."
