"""The endpoint facing a misbehaving client: every malformed request is answered (400, 401, 411, 413) with
the reason and costs bounded work (no body read for an unknown key, stalled clients dropped, connections
capped); a valid one waits for its turn."""

import json
import socket
import threading
import time

import pytest

from gyre.envs import endpoint as endpoint_module
from gyre.envs.chat_api import assistant_message
from gyre.envs.endpoint import Endpoint, Pending

BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture
def served():
    ep = Endpoint()
    key = ep.open()
    yield ep, key
    ep.close()


def _ask(ep: Endpoint, head: str, body: bytes = b"", timeout: float = 5.0) -> tuple[int, dict, bytes]:
    """Send raw bytes; the status, headers and body of the answer (status 0: the connection was closed)."""
    host, port = ep._server.server_address[:2]
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(head.encode() + b"\r\n\r\n" + body)  # UTF-8: a client may send any bytes
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                return 0, {}, data
            data += chunk
        head_bytes, _, rest = data.partition(b"\r\n\r\n")
        lines = head_bytes.decode("latin-1").split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        while len(rest) < int(headers.get("Content-Length", 0)):
            rest += s.recv(65536)
        return int(lines[0].split()[1]), headers, rest


def _post(key: str, length: str | None = None, extra: str = "") -> str:
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}"
    return head + (f"\r\nContent-Length: {length}" if length is not None else "") + extra


@pytest.mark.parametrize("length, status, why", [
    (None, 411, "needs its body's length"), ("-1", 400, "needs its body's length"),
    ("ten", 400, "needs its body's length"), ("\u00b2", 400, "needs its body's length"),
    ("9" * 5000, 400, "needs its body's length"), (str(endpoint_module.MAX_BODY + 1), 413, "at most"),
])
def test_a_body_needs_its_declared_length_within_the_cap(served, length, status, why):
    ep, key = served
    code, headers, body = _ask(ep, _post(key, length))
    assert code == status and why in json.loads(body)["error"]["message"]
    assert headers.get("Connection") == "close"  # the unread body cannot be taken for the next request


def test_an_unknown_key_is_refused_before_its_body_is_read(served):
    ep, _ = served
    start = time.monotonic()
    code, _, body = _ask(ep, _post("gyre-wrong", "1000000"))  # the body is never sent: nothing waits for it
    assert code == 401 and time.monotonic() - start < 2.0
    for key in ("gyré-ключ", ""):  # not ASCII, or empty: refused, not a dropped connection
        assert _ask(ep, _post(key, str(len(BODY))), BODY)[0] == 401


@pytest.mark.parametrize("body, why", [
    (b"{not json", "not a JSON document"), (b"\xff\xfe", "not a JSON document"),
    (b"[" * 100_000 + b"]" * 100_000, "not a JSON document"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), "temperature"),
    (json.dumps({"messages": [{"role": "assistant", "tool_calls": [{"id": "1"}]}]}).encode(), "tool_calls"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stop": 5}).encode(), "stop=5"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1' + b"0" * 400 + b"}", "a finite number"),
    (b'{"messages": [{"role": "user", "content": "x"}], "metadata": ' + b"[" * 70 + b"]" * 70 + b"}",
     "nests deeper than 64"),
])
def test_a_malformed_request_is_answered_400_with_the_reason(served, body, why):
    ep, key = served
    code, _, answer = _ask(ep, _post(key, str(len(body))), body)
    assert code == 400 and why in json.loads(answer)["error"]["message"]


def test_a_valid_request_waits_for_its_turn_and_gets_n_choices(served):
    ep, key = served
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "n": 2}).encode()
    answered = {}
    thread = threading.Thread(target=lambda: answered.update(r=_ask(ep, _post(key, str(len(body))), body)))
    thread.start()
    pending = ep.next_event(5.0)
    assert isinstance(pending, Pending) and pending.request.n == 2
    pending.answer([assistant_message("a", "none"), assistant_message("b", "none")])
    thread.join(5.0)
    code, _, answer = answered["r"]
    assert code == 200 and [c["message"]["content"] for c in json.loads(answer)["choices"]] == ["a", "b"]


def test_a_stalled_client_is_dropped_and_connections_are_capped(monkeypatch):
    monkeypatch.setattr(endpoint_module, "CLIENT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(endpoint_module, "MAX_CONNECTIONS", 2)
    ep = Endpoint()
    try:
        host, port = ep._server.server_address[:2]
        stalled = [socket.create_connection((host, port), timeout=5.0) for _ in range(2)]
        for s in stalled:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")  # and nothing more
        time.sleep(0.2)
        code, _, _ = _ask(ep, "GET /v1/models HTTP/1.1\r\nHost: x")
        assert code == 503  # both connections are taken
        for s in stalled:  # dropped past the client timeout
            assert s.recv(1024) == b""
            s.close()
        time.sleep(0.2)
        key = ep.open()
        assert _ask(ep, f"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}")[0] == 200
        code, headers, _ = _ask(ep, "GET /v1/models HTTP/1.1\r\nHost: x")  # no key: refused, and not kept alive
        assert code == 401 and headers.get("Connection") == "close"
    finally:
        ep.close()


def test_a_client_trickling_its_request_is_dropped_at_the_deadline_for_the_whole_request(monkeypatch):
    monkeypatch.setattr(endpoint_module, "CLIENT_TIMEOUT_S", 1.0)
    ep = Endpoint()
    try:
        host, port = ep._server.server_address[:2]
        start = time.monotonic()
        with socket.create_connection((host, port), timeout=5.0) as s:
            try:
                for byte in b"POST /v1/chat/completions HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                    s.sendall(bytes([byte]))  # each read gets a byte well within the socket's own timeout
                    time.sleep(0.05)
            except OSError:
                pass  # dropped while sending
            s.settimeout(5.0)
            assert s.recv(1024) == b""
        assert time.monotonic() - start < 4.0
    finally:
        ep.close()


def test_a_session_has_at_most_max_waiting_requests_and_deep_arguments_stay_text(served):
    ep, key = served
    deep = json.dumps({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {
        "name": "f", "arguments": "[" * 3000 + "]" * 3000}}]}, {"role": "user", "content": "x"}]}).encode()
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(_ask(ep, _post(key, str(len(deep))), deep)))
               for _ in range(endpoint_module.MAX_WAITING + 1)]
    for t in threads:
        t.start()
    waiting = [ep.next_event(5.0) for _ in range(endpoint_module.MAX_WAITING)]
    time.sleep(0.3)
    assert [a[0] for a in answers] == [429]  # the one past the cap, at once
    assert waiting[0].request.messages[0]["tool_calls"][0]["function"]["arguments"] == "[" * 3000 + "]" * 3000
    for pending in waiting:
        pending.answer([assistant_message("ok", "none")])
    for t in threads:
        t.join(5.0)
    assert sorted(a[0] for a in answers) == [200] * endpoint_module.MAX_WAITING + [429]
