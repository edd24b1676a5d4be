"""An OpenAI-compatible HTTP endpoint for one agent session at a time (``gyre.envs.agent``'s).

The agent program's requests do not reach an engine from here: each one waits in a queue until the
environment that owns the endpoint takes it (``next_event``) as its observation, and answers it with
the model's turn (``Pending.answer``) once the rollout has sampled it. So every turn an agent gets went
through gyre's scheduler like any episode's (staleness, partial rollouts, aborts, weight updates).

Each session has its own API key (``open``): a request with another key (a previous episode's agent
still running) is refused with 401, and closing a session refuses whatever of it is still waiting.
Bodies are capped (``MAX_BODY``), every wait has a deadline, and the server listens on the loopback
interface only (the agent runs beside it, in the same environment worker).
"""

from __future__ import annotations

import hmac
import json
import queue
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gyre.envs.chat_api import ChatRequest, RequestError, completion, read_request, stream_chunks

MAX_BODY = 8 << 20
"""Largest request body read (8 MiB): a conversation longer than that is not a turn's context here."""


@dataclass
class Pending:
    """A request waiting for its answer: the handler thread blocks on ``done``."""

    request: ChatRequest
    done: threading.Event = field(default_factory=threading.Event)
    status: int = 200
    body: object = None
    """The answer: a chat.completion (or its chunks when streaming), or an error's message."""

    def answer(self, message: dict, finish: str, usage: dict | None = None) -> None:
        r = self.request
        self.body = stream_chunks(message, finish, r.model, usage if r.include_usage else None) if r.stream \
            else completion(message, finish, r.model, usage)
        self.done.set()

    def fail(self, status: int, message: str) -> None:
        self.status, self.body = status, message
        self.done.set()


class Endpoint:
    """``/v1/chat/completions`` and ``/v1/models`` on 127.0.0.1 (a free port); ``url`` is the base URL."""

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, answer_timeout_s: float = 600.0):
        self.temperature, self.top_p, self.answer_timeout_s = temperature, top_p, answer_timeout_s
        self._key: str | None = None
        self._lock = threading.Lock()
        self._events: queue.Queue = queue.Queue()
        self._waiting: list[Pending] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="gyre-agent-endpoint", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def open(self) -> str:
        """A new session: its API key. The previous session's waiting requests are refused."""
        self.end_session()
        with self._lock:
            self._key = f"gyre-{secrets.token_hex(16)}"
            return self._key

    def end_session(self) -> None:
        with self._lock:
            self._key, waiting, self._waiting = None, self._waiting, []
        for p in waiting:
            if not p.done.is_set():
                p.fail(409, "this agent session has ended (its episode is over)")
        while True:  # events of the old session: nothing may carry over
            try:
                self._events.get_nowait()
            except queue.Empty:
                return

    def post(self, event) -> None:
        """An event for the environment besides requests (the agent program ended: its outcome)."""
        self._events.put(event)

    def next_event(self, timeout: float):
        """The next request of the session (a ``Pending``), or another posted event; None past ``timeout``."""
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def _admit(self, key: str | None, body: object) -> Pending | tuple[int, str]:
        with self._lock:
            if self._key is None or key is None or not hmac.compare_digest(key, self._key):
                return 401, "unknown API key: each episode's agent gets its own (this one's episode is over)"
            try:
                pending = Pending(read_request(body, self.temperature, self.top_p))
            except RequestError as exc:
                return 400, str(exc)
            self._waiting = [p for p in self._waiting if not p.done.is_set()] + [pending]
        self._events.put(pending)
        return pending

    def close(self) -> None:
        self.end_session()
        self._server.shutdown()
        self._server.server_close()


def _handler(endpoint: Endpoint):
    class ChatHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # the agent's requests are counted, not logged
            pass

        def do_GET(self) -> None:  # noqa: N802 - the http.server API
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._json(200, {"object": "list", "data": [{"id": "gyre-policy", "object": "model",
                                                             "owned_by": "gyre"}]})
            else:
                self._error(404, f"no route {self.path}: POST /v1/chat/completions")

        def do_POST(self) -> None:  # noqa: N802
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._error(404, f"no route {self.path}: POST /v1/chat/completions")
                return
            size = int(self.headers.get("Content-Length") or 0)
            if size > MAX_BODY:
                self._error(413, f"request body of {size} bytes: at most {MAX_BODY}")
                return
            try:
                body = json.loads(self.rfile.read(size) or b"null")
            except ValueError:
                self._error(400, "the body is not JSON")
                return
            auth = self.headers.get("Authorization", "")
            admitted = endpoint._admit(auth[7:] if auth.startswith("Bearer ") else None, body)
            if isinstance(admitted, tuple):
                self._error(*admitted)
                return
            if not admitted.done.wait(endpoint.answer_timeout_s):
                admitted.fail(504, f"no turn within {endpoint.answer_timeout_s:g} s")
            if admitted.status != 200:
                self._error(admitted.status, str(admitted.body))
            elif admitted.request.stream:
                self._events_stream(admitted.body)
            else:
                self._json(200, admitted.body)

        def _json(self, status: int, value: object) -> None:
            data = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            kind = "invalid_request_error" if status < 500 else "server_error"
            self._json(status, {"error": {"message": message, "type": kind, "code": status}})

        def _events_stream(self, chunks: list[dict]) -> None:
            data = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return ChatHandler
