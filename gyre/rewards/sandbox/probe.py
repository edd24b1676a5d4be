"""Which sandbox layers this machine gives, found once per process by running a probe program.

Three modes, strongest first:

- ``root``: gyre runs as root. Namespaces (PID, mount, network, IPC, UTS), a new root file system,
  a dedicated uid per run, rlimits, no_new_privs and seccomp.
- ``userns``: not root, but unprivileged user namespaces work. The same namespaces and root file
  system; the program runs as the one uid mapped into the namespace (the caller's), without
  capabilities.
- ``weak``: neither (not Linux, or a container or kernel that forbids namespaces). Only rlimits, a
  process group and the Python audit hook remain, and the program sees the host's files as the
  caller's uid does. Untrusted code is refused in this mode unless the user accepts it explicitly.

A mode counts only if a probe program run in it shows the layers at work: it is PID 2 of its own
namespace, a host path is not visible, a network socket cannot be made (seccomp), and it runs as the
expected uid. Without seccomp (an architecture with no syscall table here) the mode stands and the
report says so.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from dataclasses import dataclass
from typing import Literal

Mode = Literal["root", "userns", "weak"]

_PROBE = """
import json, os, socket
facts = {"pid": os.getpid(), "uid": os.getuid(), "host_visible": os.path.exists(%r)}
try:
    socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    facts["inet_socket"] = True
except OSError:
    facts["inet_socket"] = False
os.write(3, json.dumps(facts).encode())
"""


@dataclass(frozen=True)
class Capabilities:
    mode: Mode
    seccomp: bool
    reason: str = ""
    """Why the mode is weaker than ``root`` (empty for root)."""

    @property
    def contained(self) -> bool:
        return self.mode != "weak"

    def as_dict(self) -> dict:
        ns = self.contained
        return {
            "mode": self.mode, "platform": sys.platform, "root": os.geteuid() == 0, "rlimits": True,
            "audit_hook": True, "process_group": True, "pid_namespace": ns, "mount_namespace": ns,
            "private_root": ns, "network_namespace": ns, "ipc_namespace": ns, "tmpfs_work_dir": ns,
            "per_run_uid": self.mode == "root", "user_namespace": self.mode == "userns",
            "seccomp": self.seccomp, "no_new_privs": ns, "rlimit_nproc": ns or os.geteuid() != 0,
            "reason": self.reason,
        }

    def describe(self) -> str:
        """One line for start-up: the layers in force, or what is missing."""
        if not self.contained:
            return f"code sandbox: WEAK (rlimits, process group and Python audit hook only): {self.reason}"
        who = "a dedicated uid per run" if self.mode == "root" else "a user namespace (no capabilities)"
        filt = "seccomp filter" if self.seccomp else "no seccomp filter (no syscall table for this CPU)"
        return (f"code sandbox: PID, mount, network, IPC and UTS namespaces; a private read-only root with a "
                f"tmpfs work dir; {who}; rlimits; no_new_privs; {filt}")

    def refusal(self) -> str:
        return (f"gyre refuses to run untrusted code here: this machine cannot contain it ({self.reason}). "
                "Without namespaces a program sees the host's files and can outlive its run. Run as root or "
                "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 or "
                "user.max_user_namespaces > 0), point the domain at a remote sandbox "
                "(reward.domains.<name>.sandbox.url), or accept weak containment explicitly with "
                "reward.domains.<name>.sandbox.allow_weak: true.")


def _try(mode: Mode, filtered: bool) -> tuple[bool, str]:
    import shutil
    import tempfile

    from gyre.rewards.sandbox.local import UID_BASE, SandboxLimits, SandboxUnavailable, _run_namespaced

    folder = tempfile.mkdtemp(prefix="gyre-probe-")
    marker = os.path.join(folder, "host-file")  # a host file that must not be visible inside
    try:
        open(marker, "w").close()
        out = _run_namespaced(mode, _PROBE % marker, "", SandboxLimits(wall_s=20.0, cpu_s=10.0), False, 1, filtered)
    except (SandboxUnavailable, OSError) as exc:
        return False, str(exc)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        facts = json.loads(out.channels[0])
    except ValueError:
        return False, f"the probe program failed ({out.status}): {out.stderr.strip()[-300:]}"
    expected_uid = out.uid if mode == "root" else 1000
    problems = [what for what, bad in (
        ("not in its own PID namespace", facts["pid"] != 2),
        ("a host file is visible", facts["host_visible"]),
        ("an unexpected uid", facts["uid"] != expected_uid or (mode == "root" and (out.uid or 0) < UID_BASE)),
        ("network sockets allowed", filtered and facts["inet_socket"])) if bad]
    return not problems, "; ".join(problems)


def _try_twice(mode: Mode, filtered: bool) -> tuple[bool, str]:
    """A probe can fail for a passing reason (a loaded machine); a mode is given up only after two."""
    works, why = _try(mode, filtered)
    return (works, why) if works else _try(mode, filtered)


@functools.lru_cache(maxsize=1)
def capabilities() -> Capabilities:
    """Probe once per process (about 0.1 s) and remember."""
    from gyre.rewards.sandbox import seccomp

    if not sys.platform.startswith("linux"):
        return Capabilities("weak", False, f"{sys.platform} has no Linux namespaces")
    mode: Mode = "root" if os.geteuid() == 0 else "userns"
    filtered = seccomp.supported()
    works, why = _try_twice(mode, filtered)
    if not works and filtered:
        works_plain, _ = _try_twice(mode, False)
        if works_plain:  # reported at start-up (describe) and in sandbox_capabilities()
            return Capabilities(mode, False, f"seccomp refused: {why}")
    if not works:
        what = "as root" if mode == "root" else "with a user namespace (not root)"
        return Capabilities("weak", False, f"namespaces do not work {what}: {why}")
    return Capabilities(mode, filtered, "" if mode == "root" else "not root: one uid for every run")
