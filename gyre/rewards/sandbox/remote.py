"""A remote sandbox: untrusted programs run on another machine, behind the same interface.

``gyre sandbox-serve`` runs ``serve`` on a machine set aside for untrusted code; code domains with
``sandbox.url`` send each program there (``run_remote``) instead of running it on the reward worker's
machine, so a kernel escape would land off the training nodes. The server runs every request in the
local sandbox (namespaces, private root, per-run uid, seccomp), clamps the requested limits to its own
maximums, allows a bounded number of concurrent runs, and checks a bearer token when it has one.

Protocol: ``POST /run`` with JSON ``{"source", "stdin", "limits": {SandboxLimits fields}, "channels",
"audit_hook", "isolate"}`` answers the ``RunOutcome`` as JSON (data channels base64-encoded); ``GET /health``
answers the server's sandbox capabilities.
"""

from __future__ import annotations

import base64
import dataclasses
import hmac
import json
import os
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gyre.rewards.sandbox.local import RunOutcome, SandboxLimits, SandboxUnavailable, run_python, sandbox_capabilities

_MAX_BODY = 32 << 20
_LIMIT_FIELDS = {f.name for f in dataclasses.fields(SandboxLimits)} - {"allow_read"}


def run_remote(url: str, source: str, stdin: str = "", limits: SandboxLimits | None = None, *, channels: int = 0,
               token: str | None = None, audit_hook: bool = True, isolate: bool = False) -> RunOutcome:
    """Run ``source`` in the sandbox server at ``url``; raises SandboxUnavailable when it cannot be reached
    or refuses the request (never for what the program does)."""
    limits = limits or SandboxLimits()
    body = {"source": source, "stdin": stdin, "channels": channels, "audit_hook": audit_hook, "isolate": isolate,
            "limits": {k: v for k, v in dataclasses.asdict(limits).items() if k in _LIMIT_FIELDS}}
    request = urllib.request.Request(url.rstrip("/") + "/run", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=limits.wall_s + 30.0) as response:
            data = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:300]
        raise SandboxUnavailable(f"the sandbox server at {url} refused the program (HTTP {exc.code}): "
                                 f"{detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SandboxUnavailable(f"the sandbox server at {url} cannot be reached ({exc}); start it with "
                                 "`gyre sandbox-serve` there, or check reward.domains.<name>.sandbox.url") from None
    data["channels"] = [base64.b64decode(c) for c in data.get("channels", [])]
    return RunOutcome(**data)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What the server allows: each request's limits are clamped to ``most``, field by field."""

    most: SandboxLimits = SandboxLimits(cpu_s=60.0, wall_s=60.0, memory_mb=2048, disk_mb=256, processes=16)
    concurrent: int = max(1, os.cpu_count() or 1)
    """Programs run at once; further requests wait."""


_LEAST = {"cpu_s": 0.1, "wall_s": 0.1, "memory_mb": 32, "file_size_mb": 1, "disk_mb": 1, "files": 16, "processes": 0,
          "output_bytes": 1024, "channel_bytes": 1024}
"""The least a request may ask for: zero and negative rlimits mean "unlimited" to the kernel."""


def _clamp(requested: dict, cap: ServerLimits) -> SandboxLimits:
    """The request's limits, each a finite number of the field's type within [least, the server's most];
    raises ValueError for anything else (NaN, negative, unknown fields, wrong types)."""
    import math

    most = dataclasses.asdict(cap.most)
    fields = {}
    for key, value in requested.items():
        if key not in _LIMIT_FIELDS:
            raise ValueError(f"unknown limit {key!r}")
        kind = type(most[key])
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (kind is int and value != int(value)):
            raise ValueError(f"limit {key!r} must be a finite {kind.__name__}, got {value!r}")
        fields[key] = kind(min(max(value, _LEAST[key]), most[key]))
    defaults = {k: min(v, most[k]) for k, v in dataclasses.asdict(SandboxLimits()).items() if k in _LIMIT_FIELDS}
    return SandboxLimits(**{**defaults, **fields})


def make_server(host: str = "127.0.0.1", port: int = 8765, token: str | None = None,
                caps: ServerLimits | None = None) -> ThreadingHTTPServer:
    """A sandbox server (not started: call ``serve_forever``). It refuses to start where the kernel cannot
    contain programs: a remote sandbox is never weak."""
    if sandbox_capabilities()["mode"] == "weak":
        raise SandboxUnavailable(f"this machine cannot contain untrusted code: {sandbox_capabilities()['reason']}")
    caps = caps or ServerLimits()
    slots = threading.BoundedSemaphore(caps.concurrent)

    class Handler(BaseHTTPRequestHandler):
        timeout = 60  # seconds a client may take to send its request

        def log_message(self, *args) -> None:  # quiet: one line per program would flood the console
            pass

        def _reply(self, code: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorised(self) -> bool:
            given = self.headers.get("Authorization", "")
            return token is None or hmac.compare_digest(given.encode(), f"Bearer {token}".encode())

        def do_GET(self) -> None:
            if not self._authorised():
                return self._reply(401, {"error": "missing or wrong bearer token"})
            self._reply(200, sandbox_capabilities() if self.path == "/health" else {"error": "unknown path"})

        def do_POST(self) -> None:
            if not self._authorised():
                return self._reply(401, {"error": "missing or wrong bearer token"})
            size = int(self.headers.get("Content-Length") or 0)
            if self.path != "/run" or not 0 < size <= _MAX_BODY:
                return self._reply(400, {"error": f"POST /run with a JSON body of at most {_MAX_BODY} bytes"})
            try:
                req = json.loads(self.rfile.read(size))
                limits = _clamp(req.get("limits", {}), caps)
                args = (str(req["source"]), str(req.get("stdin", "")), limits)
                channels, audit = max(0, min(int(req.get("channels", 0)), 8)), bool(req.get("audit_hook", True))
                isolate = bool(req.get("isolate", False))
            except (ValueError, KeyError, TypeError) as exc:
                return self._reply(400, {"error": f"bad request: {exc}"})
            if not slots.acquire(timeout=caps.most.wall_s * 2):
                return self._reply(503, {"error": "every sandbox slot stayed busy; retry later"})
            try:
                out = run_python(*args, channels=channels, audit_hook=audit, isolate=isolate)
            except SandboxUnavailable as exc:
                return self._reply(500, {"error": str(exc)})
            finally:
                slots.release()
            payload = dataclasses.asdict(out)
            payload["channels"] = [base64.b64encode(c).decode() for c in out.channels]
            self._reply(200, payload)

    return ThreadingHTTPServer((host, port), Handler)
