"""The egress proxy (workers/egress.py) over its real Unix socket, with real servers behind it: a CONNECT
tunnel and a plain-HTTP request reach an allowed server, everything else gets a 403 with the reason, each
refusal is reported once per run, and a broken request gets a 400 without the proxy stopping."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from shared.settings.hosts import HostRule
from workers.egress import EgressProxy
from workers.egress_policy import EgressPolicy

pytestmark = pytest.mark.integration


@contextmanager
def _server() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server that records what it receives and answers each connection with one HTTP response."""
    seen: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                seen.append(data)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        listener.close()


async def _ask(path: Path, request: bytes) -> bytes:
    async with await anyio.connect_unix(str(path)) as stream:
        await stream.send(request)
        answer = b""
        with anyio.fail_after(10):
            try:
                while True:
                    answer += await stream.receive()
            except anyio.EndOfStream:
                pass
    return answer


def test_allowed_hosts_pass_and_the_rest_is_refused_once_per_run() -> None:
    refused: list[tuple[str, str, str]] = []
    with _server() as (allowed, seen), _server() as (other, other_seen):
        policy = EgressPolicy("coder", (HostRule("127.0.0.1", allowed),))

        async def on_refused(agent: str, run_id: str, target: str, why: str) -> None:
            refused.append((agent, run_id, target))

        async def main() -> dict[str, bytes]:
            out: dict[str, bytes] = {}
            async with EgressProxy(lambda agent: policy, on_refused) as proxy:
                path = await proxy.socket_for("coder")
                assert oct(path.stat().st_mode & 0o777) == "0o600"
                proxy.new_run("coder", "run_1")
                out["plain"] = await _ask(
                    path,
                    f"GET http://127.0.0.1:{allowed}/v1/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:{allowed}\r\n"
                    "Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive\r\n\r\n".encode(),
                )
                tunnel = (
                    f"CONNECT 127.0.0.1:{allowed} HTTP/1.1\r\n\r\nGET /through HTTP/1.1\r\nHost: x\r\n\r\n"
                ).encode()
                out["tunnel"] = await _ask(path, tunnel)
                for _ in range(2):  # the second refusal of the same host is logged, not reported again
                    out["other"] = await _ask(path, f"CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n".encode())
                out["postgres"] = await _ask(path, b"GET http://127.0.0.1:5432/ HTTP/1.1\r\n\r\n")
                out["https-uri"] = await _ask(path, b"GET https://127.0.0.1/ HTTP/1.1\r\n\r\n")
                out["garbage"] = await _ask(path, b"\x16\x03\x01 not http\r\n\r\n")
                proxy.new_run("coder", "run_2")
                out["again"] = await _ask(path, f"CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n".encode())
            assert not path.exists()  # the socket goes with the proxy
            return out

        out = anyio.run(main)
    assert out["plain"].startswith(b"HTTP/1.1 200 OK") and out["plain"].endswith(b"hello")
    head = seen[0]
    assert head.startswith(b"GET /v1/x?y=1 HTTP/1.1\r\n"), head  # origin form, as a server expects
    assert b"Proxy-Authorization" not in head and b"Connection: close" in head and b"keep-alive" not in head
    assert out["tunnel"].startswith(b"HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 200 OK")
    assert seen[1].startswith(b"GET /through HTTP/1.1")
    assert out["other"].startswith(b"HTTP/1.1 403") and f"127.0.0.1:{other}".encode() in out["other"]
    assert out["postgres"].startswith(b"HTTP/1.1 403") and not other_seen
    assert out["https-uri"].startswith(b"HTTP/1.1 400") and out["garbage"].startswith(b"HTTP/1.1 400")
    assert refused == [
        ("coder", "run_1", f"127.0.0.1:{other}"),
        ("coder", "run_1", "127.0.0.1:5432"),
        ("coder", "run_2", f"127.0.0.1:{other}"),
    ]


def test_a_name_that_resolves_to_this_machine_is_refused_by_its_address() -> None:
    """``localhost`` passes the name check of an open policy and is refused once resolved (DNS rebinding)."""

    async def main() -> bytes:
        async with EgressProxy(lambda agent: EgressPolicy("coder", open=True)) as proxy:
            path = await proxy.socket_for("coder")
            return await _ask(path, b"CONNECT localhost:6379 HTTP/1.1\r\n\r\n")

    answer = anyio.run(main)
    assert answer.startswith(b"HTTP/1.1 403") and b"local or private address" in answer


def test_the_socket_folder_of_a_killed_processor_is_removed_by_the_next() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = Path(tempfile.gettempdir()) / f"agentpost-egress-{dead.pid}-left"
    left.mkdir()
    (left / "coder.sock").write_text("")  # what a kill -9 leaves
    alive = Path(tempfile.mkdtemp(prefix=f"agentpost-egress-{os.getpid()}-"))  # a running processor's

    async def main() -> None:
        async with EgressProxy(lambda agent: EgressPolicy("coder")) as proxy:
            await proxy.socket_for("coder")

    try:
        anyio.run(main)
        assert not left.exists() and alive.exists()
    finally:
        shutil.rmtree(left, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)
