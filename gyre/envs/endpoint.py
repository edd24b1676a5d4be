"""An OpenAI-compatible HTTP endpoint for one agent session at a time (``gyre.envs.agent``'s).

The agent program's requests do not reach an engine from here: each one waits in a queue until the
environment that owns the endpoint takes it (``next_event``) as its observation, and answers it with
the model's turn (``Pending.answer``) once the rollout has sampled it. So every turn an agent gets went
through gyre's scheduler like any episode's (staleness, partial rollouts, aborts, weight updates).

Each session has its own API key (``open``): a request with another key (a previous episode's agent
still running) is refused with 401 before its body is read, and closing a session refuses whatever of it
is still waiting. The server listens on the loopback interface only (the agent runs beside it, in the
same environment worker), and a misbehaving client costs it bounded work: a body needs its declared
length, at most ``MAX_BODY``; a client that has not sent its whole request within ``CLIENT_TIMEOUT_S``
is dropped; at most ``MAX_CONNECTIONS`` are served at once (more are answered 503) and ``MAX_WAITING``
requests of a session wait at once (429); a client without the session's key is answered 401 and its
connection closed; every wait has a deadline; and a malformed request is answered 400 with the reason,
never by a dropped connection.
"""

from __future__ import annotations

import hmac
import json
import queue
import re
import secrets
import socket
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gyre.envs.chat_api import ChatRequest, RequestError, completion, read_request, stream_chunks

MAX_BODY = 8 << 20
"""Largest request body read (8 MiB): a conversation longer than that is not a turn's context here."""
CLIENT_TIMEOUT_S = 30.0
"""Seconds a client may take to send its request (or stay idle on a kept-alive connection)."""
MAX_CONNECTIONS = 16
"""Connections served at once: an agent makes one request at a time (one conversation per episode)."""
MAX_WAITING = 4
"""Requests of a session waiting for their turns at once; more are answered 429."""


@dataclass
class Pending:
    """A request waiting for its answer: the handler thread blocks on ``done``."""

    request: ChatRequest
    done: threading.Event = field(default_factory=threading.Event)
    status: int = 200
    body: object = None
    """The answer: a chat.completion (or its chunks when streaming), or an error's message."""

    def answer(self, choices: list[tuple[dict, str]], usage: dict | None = None) -> None:
        """Answer with ``choices``: (assistant message, finish reason) for each of the request's ``n``."""
        r = self.request
        self.body = stream_chunks(choices, r.model, usage if r.include_usage else None) if r.stream \
            else completion(choices, r.model, usage)
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
        self._server = _Server(("127.0.0.1", 0), _handler(self))
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

    def _authorised(self, key: str | None) -> bool:
        with self._lock:
            return self._matches(key)

    def _matches(self, key: str | None) -> bool:
        """``key`` is the session's (the caller holds the lock)."""
        return self._key is not None and key is not None and \
            hmac.compare_digest(key.encode("utf-8", "surrogatepass"), self._key.encode())

    def _admit(self, key: str | None, body: object) -> Pending | tuple[int, str]:
        try:
            request = read_request(body, self.temperature, self.top_p)
        except RequestError as exc:
            return 400, str(exc)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, OverflowError) as exc:
            return 400, f"a malformed request ({type(exc).__name__}: {str(exc)[:200]})"  # what no check named
        with self._lock:  # the key again: the session may have ended while the body was read
            if not self._matches(key):
                return 401, _UNKNOWN_KEY
            waiting = [p for p in self._waiting if not p.done.is_set()]
            if len(waiting) >= MAX_WAITING:
                return 429, f"{len(waiting)} requests of this session already wait for their turns"
            pending = Pending(request)
            self._waiting = waiting + [pending]
        self._events.put(pending)
        return pending

    def close(self) -> None:
        self.end_session()
        self._server.shutdown()
        self._server.server_close()


_UNKNOWN_KEY = "unknown API key: each episode's agent gets its own (this one's episode is over)"


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` at once: the rest are answered 503 and closed."""

    daemon_threads = True

    def __init__(self, address, handler):
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request, client_address) -> None:
        """A client that went away (reset, closed, timed out) is not worth a traceback; anything else is."""
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _handler(endpoint: Endpoint) -> type[BaseHTTPRequestHandler]:
    return type("ChatHandler", (_ChatHandler,), {"endpoint": endpoint, "timeout": CLIENT_TIMEOUT_S})


_REFUSED = object()


class _ChatHandler(BaseHTTPRequestHandler):
    """The endpoint's HTTP side (``_handler`` binds it to its endpoint)."""

    protocol_version = "HTTP/1.1"
    endpoint: Endpoint

    def log_message(self, *args) -> None:  # the agent's requests are counted, not logged
        pass

    def handle_one_request(self) -> None:
        """One request, which the client must send within ``CLIENT_TIMEOUT_S`` in all (the socket's
        timeout bounds each read only: a client trickling a byte at a time would hold the thread)."""
        self._deadline = threading.Timer(CLIENT_TIMEOUT_S, self._expire)
        self._deadline.daemon = True
        self._deadline.start()
        try:
            super().handle_one_request()
        finally:
            self._deadline.cancel()

    def _expire(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)  # its blocked read returns: the handler ends
        except OSError:
            pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        self._deadline.cancel()
        auth = self.headers.get("Authorization", "")
        if not self.endpoint._authorised(auth[7:] if auth.startswith("Bearer ") else None):
            return self._refuse(401, _UNKNOWN_KEY)  # and the connection closed: no slot held without a key
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            self._json(200, {"object": "list", "data": [{"id": "gyre-policy", "object": "model",
                                                         "owned_by": "gyre"}]})
        else:
            self._error(404, f"no route {self.path}: POST /v1/chat/completions")

    def do_POST(self) -> None:  # noqa: N802
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            return self._refuse(404, f"no route {self.path}: POST /v1/chat/completions")
        auth = self.headers.get("Authorization", "")
        key = auth[7:] if auth.startswith("Bearer ") else None
        if not self.endpoint._authorised(key):  # before the body: an unknown client costs no read
            return self._refuse(401, _UNKNOWN_KEY)
        body = self._body()
        if body is _REFUSED:
            return
        admitted = self.endpoint._admit(key, body)
        if isinstance(admitted, tuple):
            return self._error(*admitted)
        if not admitted.done.wait(self.endpoint.answer_timeout_s):
            admitted.fail(504, f"no turn within {self.endpoint.answer_timeout_s:g} s")
        if admitted.status != 200:
            self._error(admitted.status, str(admitted.body))
        elif admitted.request.stream:
            self._events_stream(admitted.body)
        else:
            self._json(200, admitted.body)

    def _body(self) -> object:
        """The request's JSON body, or ``_REFUSED`` once answered with why it cannot be read."""
        size = self.headers.get("Content-Length")
        if size is None or not re.fullmatch(r"[0-9]{1,15}", size.strip()):
            self._refuse(411 if size is None else 400,
                         f"Content-Length {size and size[:40]!r}: a request needs its body's length in bytes")
            return _REFUSED
        if int(size) > MAX_BODY:
            self._refuse(413, f"request body of {int(size)} bytes: at most {MAX_BODY}")
            return _REFUSED
        raw = self.rfile.read(int(size))
        self._deadline.cancel()  # the request is in: what follows waits for the turn, not for the client
        try:
            return json.loads(raw or b"null")
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
            self._error(400, "the body is not a JSON document")
            return _REFUSED

    def _json(self, status: int, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})

    def _refuse(self, status: int, message: str) -> None:
        """An error answered without reading the body: the connection cannot carry another request."""
        self.close_connection = True
        self._error(status, message)

    def _events_stream(self, chunks: list[dict]) -> None:
        data = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
