"""Bounded input against ``agentpost run web`` as its own OS process (issue 12).

- a 200 MB chunked POST is answered 413 after about ``api.max_body_bytes`` were read — before the token check —
  and the connection is closed, while the server's memory (VmRSS, VmHWM) grows by less than 20 MB; the same
  for the WhatsApp adapter's webhook (``agentpost run whatsapp``), before the signature check;
- a slowloris connection (a request head sent one byte a second) and a silent one are closed within
  ``api.header_timeout_seconds``; a slow-drip body gets 408 within ``api.body_timeout_seconds``;
- past ``api.max_connections`` a request and a WebSocket upgrade are answered 503, and served again once a
  connection closes.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.channel_support import Proc, channel_home, whatsapp_env
from tests.fakes.whatsapp_api import FakeWhatsApp
from tests.web_support import auth_headers, free_port, make_home, wait_until, web_process

pytestmark = pytest.mark.e2e

HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 3.0
MAX_CONNECTIONS = 4
TOKEN = "limits-token"
LIMITS = f"""
[api]
header_timeout_seconds = {HEADER_TIMEOUT}
body_timeout_seconds = {BODY_TIMEOUT}
max_connections = {MAX_CONNECTIONS}
"""


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in kB, from /proc/<pid>/status."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values


def open_socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    return sock


def read_response(sock: socket.socket, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """Read one whole response (this server closes after every refusal, so read to EOF)."""
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError):
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines[0] else 0
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes the connection within ``timeout`` (what it sent first is drained)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([sock], [], [], left)
        if readable:
            try:
                if not sock.recv(65536):
                    return True
            except ConnectionResetError:
                return True
    return False


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path, extra=LIMITS)


def stream_huge_body(port: int, path: str, total: int = 200 * 1024 * 1024) -> tuple[int, int, bytes, float]:
    """POST ``total`` bytes chunked, like an uploader: stop when the server answers or hangs up.
    Returns (bytes sent, status, response body, seconds)."""
    chunk = b"x" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sock = open_socket(port)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
    )
    sent = 0
    started = time.monotonic()
    try:
        while sent < total and time.monotonic() - started < 60:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        status, headers, body = read_response(sock)
    finally:
        sock.close()
    assert status != 413 or headers.get("connection") == "close", headers
    return sent, status, body, time.monotonic() - started


def test_huge_chunked_body_is_refused_while_read_with_flat_memory(home: Path) -> None:
    port = free_port()
    with web_process(home, port, AGENTPOST_API_TOKEN=TOKEN) as proc:
        # Warm up the code paths a request uses, so their one-time allocations are not counted as growth.
        for _ in range(3):
            httpx.post(f"http://127.0.0.1:{port}/api/message", content=b"x" * 2_000_000, timeout=10)
        before = memory_kb(proc.pid)
        sent, status, body, elapsed = stream_huge_body(port, "/api/message")
        after = memory_kb(proc.pid)

    print(f"web: sent {sent / 1e6:.1f} MB in {elapsed:.3f}s; memory before {before}, after {after} (kB)")
    assert status == 413, (status, body)
    assert "larger than 1048576 bytes" in json.loads(body)["error"]
    # The server stopped reading near the cap instead of draining 200 MB (socket buffers allow a few MB).
    assert sent < 32 * 1024 * 1024, f"the server kept reading: {sent} bytes were accepted"
    assert elapsed < 10
    assert after["VmRSS"] - before["VmRSS"] < 20 * 1024
    assert after["VmHWM"] - before["VmHWM"] < 20 * 1024


def test_huge_unsigned_whatsapp_webhook_is_refused_before_the_signature_check(tmp_path: Path) -> None:
    home = channel_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"whatsapp": {"allowlist": ["15550001111"]}}
    )
    port = free_port()
    with FakeWhatsApp() as fake:
        env = whatsapp_env(fake, "app-secret", port, verify="verify")
        adapter = Proc("whatsapp", home, env, tmp_path / "whatsapp.log")
        try:
            adapter.wait_output("webhook listening")
            url = f"http://127.0.0.1:{port}/webhook"
            for _ in range(3):
                assert httpx.post(url, content=b"{}", timeout=10).status_code == 403  # unsigned: refused
                assert httpx.post(url, content=b"x" * 4_000_000, timeout=10).status_code == 413
            before = memory_kb(adapter.popen.pid)
            sent, status, body, elapsed = stream_huge_body(port, "/webhook")
            after = memory_kb(adapter.popen.pid)
        finally:
            adapter.stop()
    print(f"whatsapp: sent {sent / 1e6:.1f} MB in {elapsed:.3f}s; memory before {before}, after {after} (kB)")
    assert status == 413, (status, body)
    assert sent < 32 * 1024 * 1024, f"the adapter kept reading: {sent} bytes were accepted"
    assert after["VmRSS"] - before["VmRSS"] < 20 * 1024
    assert after["VmHWM"] - before["VmHWM"] < 20 * 1024


def test_declared_oversize_body_is_refused_before_the_token_check(home: Path) -> None:
    port = free_port()
    with web_process(home, port, AGENTPOST_API_TOKEN=TOKEN):
        sock = open_socket(port)
        sock.sendall(
            f"POST /api/message HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {300 * 1024 * 1024}\r\n\r\n{{".encode()
        )
        status, headers, body = read_response(sock)
        sock.close()
        assert status == 413 and headers.get("connection") == "close", (status, body)
        # The same request small enough reaches the token check.
        r = httpx.post(f"http://127.0.0.1:{port}/api/message", json={"message": "hi"}, timeout=5)
        assert r.status_code == 401


def test_slowloris_and_silent_connections_are_closed_within_the_header_timeout(home: Path) -> None:
    port = free_port()
    with web_process(home, port):
        slow = open_socket(port)
        silent = open_socket(port)
        started = time.monotonic()
        slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
        closed_at: float | None = None
        received = b""
        try:
            for byte in b"X-Slow-Header: " + b"a" * 30:
                readable, _, _ = select.select([slow], [], [], 1.0)  # one header byte a second
                if readable:
                    data = slow.recv(65536)
                    received += data
                    if not data:
                        closed_at = time.monotonic() - started
                        break
                    continue
                slow.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            # The server closed first and a byte of ours met the closed socket: closed all the same.
            closed_at = time.monotonic() - started
        if closed_at is None and received and closed_by_peer(slow, 2.0):
            closed_at = time.monotonic() - started  # told 408, closed just after the loop's last look
        slow.close()
        silent_closed = closed_by_peer(silent, HEADER_TIMEOUT + 1.5)
        silent.close()
        # The server is not worse for it.
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200

    print(f"slowloris connection closed after {closed_at}s; told {received[:40]!r}")
    assert closed_at is not None, "the slowloris connection was never closed"
    assert HEADER_TIMEOUT - 0.5 <= closed_at <= HEADER_TIMEOUT + 1.5
    assert received.startswith(b"HTTP/1.1 408 ")
    assert silent_closed, "a connection that never sent a byte stayed open"


def test_slow_body_gets_408_within_the_body_timeout(home: Path) -> None:
    port = free_port()
    with web_process(home, port):
        sock = open_socket(port)
        sock.sendall(
            f"POST /api/message HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 1000\r\n\r\n{".encode()
        )
        started = time.monotonic()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            while time.monotonic() - started < BODY_TIMEOUT + 5:
                if select.select([sock], [], [], 0.5)[0]:
                    break
                sock.sendall(b" ")
        status, _, body = read_response(sock)
        elapsed = time.monotonic() - started
        sock.close()
    assert status == 408, (status, body)
    assert "did not arrive within 3 seconds" in json.loads(body)["error"]
    assert elapsed <= BODY_TIMEOUT + 1.5


@contextlib.contextmanager
def open_streams(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` live SSE connections, each answered 200 (so each holds a connection and a task)."""
    socks = []
    try:
        for _ in range(count):
            sock = open_socket(port)
            auth = "".join(f"{k}: {v}\r\n" for k, v in auth_headers(port).items())
            sock.sendall(f"GET /api/events/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(4096)
            assert head.startswith(b"HTTP/1.1 200 "), head
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def test_past_the_connection_cap_requests_get_503(home: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with web_process(home, port):
        # Up to the cap (the request's own connection included) everything is served.
        with open_streams(port, MAX_CONNECTIONS - 1):
            assert (
                httpx.get(f"{url}/api/queue/status", headers=auth_headers(port), timeout=5).status_code == 200
            )
        with open_streams(port, MAX_CONNECTIONS) as streams:
            r = httpx.get(f"{url}/api/queue/status", headers=auth_headers(port), timeout=5)
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "5"
            assert "too many open connections" in r.json()["error"]
            with pytest.raises(InvalidStatus) as refused:
                connect(
                    f"ws://127.0.0.1:{port}/api/events/ws",
                    open_timeout=5,
                    additional_headers=auth_headers(port),
                )
            assert refused.value.response.status_code == 503
            streams.pop().close()

            def served() -> bool:
                return (
                    httpx.get(f"{url}/api/queue/status", headers=auth_headers(port), timeout=5).status_code
                    == 200
                )

            wait_until(served, 5, "a request to be served once a connection closed")


def test_the_head_deadline_spares_keep_alive_clients_and_long_streams(home: Path) -> None:
    port = free_port()
    with web_process(home, port), open_streams(port, 1) as (stream,):
        # One keep-alive connection, a request every 1.5 s for longer than the header timeout: each head
        # arrives whole, so none is cut off, and the connection is reused throughout.
        peers = set()
        with contextlib.closing(open_socket(port)) as sock:
            buffer = b""
            for _ in range(4):
                sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
                while b"\r\n\r\n" not in buffer or not buffer.endswith(b"}"):
                    chunk = sock.recv(4096)
                    assert chunk, "the keep-alive connection was closed"
                    buffer += chunk
                assert buffer.startswith(b"HTTP/1.1 200 ") and buffer.endswith(b'"database":"sqlite"}'), (
                    buffer
                )
                buffer = b""
                peers.add(sock.getsockname())
                time.sleep(1.5)
        assert len(peers) == 1
        # The event stream opened before all that is still open (its head was complete long ago).
        assert not closed_by_peer(stream, 0.5)
