"""What the sandbox's new root holds: the Python installation and the shared libraries it loads.

The plan is a list of ``(kind, host_path[, link_target])`` entries that ``nsinit.populate`` replays
inside an empty tmpfs, in order: "dir" (make it), "link" (copy a symbolic link, so paths such as
/lib64 -> usr/lib64 resolve as on the host), "file" / "tree" (bind-mount read-only) and "dev" (bind
a device node; read-only but usable). Nothing else of the host is visible to the program: no home
directories, no data sets, no /etc, no other Python environments.

The libraries are found with ``ldd`` on the interpreter and every extension module of the standard
library; where ``ldd`` is missing the system library directories are bound whole instead.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random")
_LIB_DIRS = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")


def interpreter() -> str:
    """The real interpreter binary (a virtual environment's python is a link to it)."""
    return os.path.realpath(sys.executable)


def _chain(path: str, kind: str, plan: list[tuple], seen: set[str]) -> None:
    """Append what makes ``path`` exist in the new root: its directories, every symbolic link met on
    the way (followed), and finally the path itself as ``kind``."""
    todo = [p for p in path.split("/") if p][::-1]
    here = ""
    hops = 0
    while todo:
        name = todo.pop()
        if name == "..":
            here = os.path.dirname(here)
            continue
        if name == ".":
            continue
        candidate = f"{here}/{name}"
        if os.path.islink(candidate):
            target = os.readlink(candidate)
            if candidate not in seen:
                seen.add(candidate)
                plan.append(("link", candidate, target))
            hops += 1
            if hops > 40:
                raise OSError(f"too many symbolic links resolving {path}")
            if target.startswith("/"):
                here = ""
            todo.extend(p for p in target.split("/")[::-1] if p)
            continue
        last = not todo
        entry_kind = kind if last else "dir"
        if candidate not in seen:
            seen.add(candidate)
            plan.append((entry_kind, candidate))
        here = candidate


def _shared_libraries(binaries: list[str]) -> list[str] | None:
    """Absolute paths of the shared libraries ``binaries`` load (None when ldd is unavailable)."""
    ldd = shutil.which("ldd", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if ldd is None:
        return None
    try:
        out = subprocess.run([ldd, *binaries], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    libs = set()
    for line in out.splitlines():
        parts = line.split()
        for part in parts:
            if part.startswith("/") and os.path.exists(part):  # "lib => /path (addr)" and "/ld.so (addr)"
                libs.add(part)
    return sorted(libs)


@functools.lru_cache(maxsize=8)
def root_plan(extra_read: tuple[str, ...] = ()) -> tuple[tuple, ...]:
    """The new root's contents (cached: computing it runs ldd once per process)."""
    exe = interpreter()
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    binaries = [exe, *glob.glob(os.path.join(stdlib, "lib-dynload", "*.so"))]
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ldlib = sysconfig.get_config_var("LDLIBRARY") or ""
    if ldlib.endswith(".so") or ".so." in ldlib:
        binaries.append(os.path.join(libdir, ldlib))
    plan: list[tuple] = []
    seen: set[str] = set()
    _chain(exe, "file", plan, seen)
    _chain(stdlib, "tree", plan, seen)
    libs = _shared_libraries([b for b in binaries if os.path.exists(b)])
    if libs is None:
        for directory in _LIB_DIRS:
            if os.path.isdir(directory):
                _chain(directory, "tree", plan, seen)
    else:
        for lib in libs:
            _chain(lib, "file", plan, seen)
    for dev in DEVICES:
        _chain(dev, "dev", plan, seen)
    for path in extra_read:
        if os.path.isfile(path) and os.access(path, os.X_OK):  # a program: its own path (links kept) and libraries
            _chain(path, "file", plan, seen)
            for lib in _shared_libraries([path]) or []:
                _chain(lib, "file", plan, seen)
            continue
        _chain(os.path.realpath(path), "tree" if os.path.isdir(path) else "file", plan, seen)
    return tuple(plan)
