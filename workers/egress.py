"""The egress proxy: a sandboxed run's only way out of its network namespace.

Every run in the sandbox has a network of its own with nothing but loopback in it (``bwrap --unshare-net``).
The processor serves one Unix socket per agent, outside the sandbox; the socket is bound into the agent's runs,
where :mod:`workers.sandbox_entry` makes it a TCP port for ``HTTPS_PROXY``/``HTTP_PROXY``. Each connection asks
for one destination — ``CONNECT host:port`` (HTTPS and any other TLS) or a plain-HTTP request with an absolute
URI — which :class:`~workers.egress_policy.EgressPolicy` judges: the agent's AI service and the hosts the
operator named for it pass; agentpost's API, the databases, every loopback or private address and every other
host get ``403`` with the reason, are logged with the agent, run and host, and recorded as a
``network_refused`` event that ``agentpost trace`` shows.

The proxy never looks inside a tunnel and never keeps a plain-HTTP connection alive across requests (it asks
the server to close after the response, so each request is judged on its own).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

import anyio
from anyio.abc import ByteStream, SocketListener, SocketStream, TaskGroup

from workers.egress_policy import EgressPolicy, IPAddress, ip_of

log = logging.getLogger("agentpost.egress")

#: The port inside the sandbox that leads to the proxy (any: the sandbox's loopback is its own).
SANDBOX_PROXY_PORT = 3128
#: Where the agent's socket appears inside the sandbox.
SANDBOX_SOCKET = Path("/run/agentpost/egress.sock")

_MAX_HEAD = 64 * 1024
_HEAD_SECONDS = 30.0
_CONNECT_SECONDS = 15.0
#: Connections one agent may hold open through the proxy at once (a run cannot exhaust the processor).
MAX_CONNECTIONS_PER_AGENT = 256
_CHUNK = 65536
_HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"proxy-authenticate", b"te",
     b"trailer", b"upgrade"}
)  # fmt: skip

#: Told of each refused connection: agent, the run (its id, "" between runs), ``host:port``, why.
RefusedFn = Callable[[str, str, str, str], Awaitable[None]]


class _BadRequest(Exception):
    """The client's request head is not one the proxy serves (the message is the 400's reason)."""


@dataclass
class _Request:
    method: str
    host: str
    port: int
    #: What is sent to the server: for plain HTTP the rewritten head; for CONNECT nothing.
    head: bytes = b""
    #: Bytes the client sent after its head (the start of a body, or of the TLS handshake).
    rest: bytes = b""
    tunnel: bool = False


def _split_host_port(authority: str, default_port: int | None) -> tuple[str, int]:
    host, port_text = authority, ""
    if authority.startswith("["):
        host, _, tail = authority[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    elif authority.count(":") == 1:
        host, port_text = authority.split(":")
    if port_text:
        if not port_text.isdigit():
            raise _BadRequest(f"bad port in {authority!r}")
        return host, int(port_text)
    if default_port is None:
        raise _BadRequest(f"CONNECT needs host:port, not {authority!r}")
    return host, default_port


def parse_head(head: bytes, rest: bytes) -> _Request:
    """The destination of one proxy request, and (plain HTTP) the head to send on in origin form."""
    lines = head.split(b"\r\n")
    try:
        method, target, version = lines[0].decode("latin-1").split(" ")
    except ValueError:
        raise _BadRequest("malformed request line") from None
    if method == "CONNECT":
        host, port = _split_host_port(target, None)
        return _Request(method, host, port, rest=rest, tunnel=True)
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.netloc:
        raise _BadRequest("only CONNECT and plain http:// URLs go through this proxy")
    host, port = _split_host_port(parts.netloc.rpartition("@")[2], 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    out = [f"{method} {path} {version}".encode("latin-1")]
    for line in lines[1:]:
        if not line:
            continue
        name = line.split(b":", 1)[0].strip().lower()
        if name not in _HOP_BY_HOP:
            out.append(line)
    out.append(b"Connection: close")
    return _Request(method, host, port, head=b"\r\n".join(out) + b"\r\n\r\n", rest=rest)


async def _read_head(stream: ByteStream) -> tuple[bytes, bytes]:
    buffer = b""
    with anyio.fail_after(_HEAD_SECONDS):
        while b"\r\n\r\n" not in buffer:
            if len(buffer) > _MAX_HEAD:
                raise _BadRequest("request head too large")
            try:
                buffer += await stream.receive(_CHUNK)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                raise _BadRequest("connection closed before the request") from None
    head, _, rest = buffer.partition(b"\r\n\r\n")
    return head, rest


def _answer(status: str, reason: str) -> bytes:
    body = f"agentpost egress proxy: {reason}\n".encode()
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


async def _pipe(source: ByteStream, sink: ByteStream) -> None:
    """Copy until ``source`` ends, then pass the end on."""
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        async for chunk in source:
            await sink.send(chunk)
    with contextlib.suppress(Exception):
        await sink.send_eof()


async def _splice(client: ByteStream, upstream: ByteStream, *, tunnel: bool) -> None:
    """Carry bytes both ways until both ends are done. A plain-HTTP exchange is over when the server has
    answered and closed (it was asked to): a client that keeps its side open is not waited for."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(_pipe, client, upstream)
        await _pipe(upstream, client)
        if not tunnel:
            tg.cancel_scope.cancel()


async def _resolve(host: str, port: int) -> list[IPAddress]:
    literal = ip_of(host)
    if literal is not None:
        return [literal]
    with anyio.fail_after(_CONNECT_SECONDS):
        found = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for *_, sockaddr in found:
        address = ip_of(str(sockaddr[0]))
        if address is not None and address not in addresses:
            addresses.append(address)
    return addresses


def _remove_left_behind() -> None:
    """Remove the socket folders of processors that died without removing theirs (a ``kill -9``): the
    folder's name carries its processor's pid, and only this user's folders are touched."""
    for folder in Path(tempfile.gettempdir()).glob("agentpost-egress-*-*"):
        try:
            pid = int(folder.name.split("-")[2])
            if folder.stat().st_uid != os.geteuid():
                continue
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, OSError):
            continue


@dataclass
class _AgentSocket:
    path: Path
    listener: SocketListener
    open_connections: int = 0
    refused: set[str] = field(default_factory=set)
    run_id: str = ""


class EgressProxy:
    """The processor's egress proxy (see the module docstring). Use as an async context manager; it stops,
    and its sockets are removed, when the context ends.

    ``policy`` gives an agent's policy at the moment of each connection (an edit of the settings applies to
    the next connection); ``on_refused`` is told of each refusal, once per agent and ``host:port`` until
    :meth:`new_run` (the run's events name it; the log has every one)."""

    def __init__(self, policy: Callable[[str], EgressPolicy], on_refused: RefusedFn | None = None) -> None:
        self._policy = policy
        self._on_refused = on_refused
        self._sockets: dict[str, _AgentSocket] = {}
        self._dir: Path | None = None
        self._tg: TaskGroup | None = None
        self._lock = anyio.Lock()

    async def __aenter__(self) -> EgressProxy:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(kind, exc, tb)
        finally:
            for entry in self._sockets.values():
                with contextlib.suppress(Exception):
                    await entry.listener.aclose()
            self._sockets.clear()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)

    async def socket_for(self, agent: str, owner: tuple[int, int] | None = None) -> Path:
        """The Unix socket of ``agent``'s runs, opened on first use. ``owner``: the (uid, gid) the agent's
        runs have, when it is not this process's own (only that user, and root, may connect)."""
        async with self._lock:
            entry = self._sockets.get(agent)
            if entry is not None:
                return entry.path
            if self._tg is None:
                raise RuntimeError("the egress proxy is not running")
            if self._dir is None:
                # A short path (a Unix socket's path has ~107 bytes); 0700: no other local user reaches it.
                _remove_left_behind()
                self._dir = Path(tempfile.mkdtemp(prefix=f"agentpost-egress-{os.getpid()}-"))
            path = self._dir / f"{agent}.sock"
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            raw.bind(str(path))
            if owner is not None:
                os.chown(path, *owner)
            os.chmod(path, 0o600)
            raw.listen(128)
            listener = await SocketListener.from_socket(raw)
            entry = _AgentSocket(path, listener)
            self._sockets[agent] = entry
            self._tg.start_soon(self._serve, agent, entry)
            return path

    def new_run(self, agent: str, run_id: str) -> None:
        """A run of ``agent`` starts: its refusals are reported again, and named after it."""
        entry = self._sockets.get(agent)
        if entry is not None:
            entry.refused.clear()
            entry.run_id = run_id

    async def _serve(self, agent: str, entry: _AgentSocket) -> None:
        async with anyio.create_task_group() as tg:
            while True:
                try:
                    client = await entry.listener.accept()
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
                except OSError as exc:
                    log.warning("egress proxy for agent %s: accept failed: %s", agent, exc)
                    await anyio.sleep(0.1)
                    continue
                if entry.open_connections >= MAX_CONNECTIONS_PER_AGENT:
                    with contextlib.suppress(Exception):
                        await client.send(_answer("503 Service Unavailable", "too many connections"))
                    await client.aclose()
                    continue
                tg.start_soon(self._handle, agent, entry, client)

    async def _handle(self, agent: str, entry: _AgentSocket, client: SocketStream) -> None:
        entry.open_connections += 1
        try:
            async with client:
                await self._relay(agent, entry, client)
        except Exception as exc:  # one connection's failure never stops the proxy
            log.debug("egress proxy for agent %s: connection ended: %r", agent, exc)
        finally:
            entry.open_connections -= 1

    async def _relay(self, agent: str, entry: _AgentSocket, client: SocketStream) -> None:
        try:
            head, rest = await _read_head(client)
            request = parse_head(head, rest)
        except (_BadRequest, TimeoutError) as exc:
            with contextlib.suppress(Exception):
                await client.send(_answer("400 Bad Request", str(exc) or "no request in time"))
            return
        policy = self._policy(agent)
        why = policy.refuse_name(request.host, request.port)
        addresses: list[IPAddress] = []
        if why is None:
            try:
                addresses = await _resolve(request.host, request.port)
            except (OSError, TimeoutError):
                await client.send(_answer("502 Bad Gateway", f"cannot resolve {request.host}"))
                return
            why = policy.refuse_addresses(request.host, request.port, addresses)
        if why is not None:
            await client.send(_answer("403 Forbidden", why))
            await self._refused(agent, entry, request, why)
            return
        upstream = await self._connect(addresses, request.port)
        if upstream is None:
            await client.send(_answer("502 Bad Gateway", f"cannot connect to {request.host}:{request.port}"))
            return
        async with upstream:
            if request.tunnel:
                await client.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                await upstream.send(request.head)
            if request.rest:
                await upstream.send(request.rest)
            await _splice(client, upstream, tunnel=request.tunnel)

    async def _connect(self, addresses: list[IPAddress], port: int) -> SocketStream | None:
        for address in addresses:
            try:
                with anyio.fail_after(_CONNECT_SECONDS):
                    return await anyio.connect_tcp(str(address), port)
            except (OSError, TimeoutError):
                continue
        return None

    async def _refused(self, agent: str, entry: _AgentSocket, request: _Request, why: str) -> None:
        target = f"{request.host}:{request.port}"
        log.warning(
            "agent %s (run %s): refused a connection to %s: %s", agent, entry.run_id or "-", target, why
        )
        if target in entry.refused or self._on_refused is None:
            return
        entry.refused.add(target)
        with contextlib.suppress(Exception):
            await self._on_refused(agent, entry.run_id, target, why)
