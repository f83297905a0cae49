"""Bounded input for every HTTP server agentpost runs (the web adapter, the WhatsApp and Slack webhooks): one
place.

What each limit stops, and where it lives:

- **Body size** (:class:`BodyLimit`, ASGI): a declared ``Content-Length`` over the cap is answered 413 before a
  byte of the body is read; a chunked body is counted while it is read and answered 413 the moment it passes
  the cap. Nothing is buffered beyond uvicorn's own 64 KiB read window, so memory stays flat however much a
  client sends, and the 413 comes before any token, signature or JSON work. The answer carries
  ``Connection: close`` so the server stops reading the rest instead of draining it.
- **Slow body** (:class:`BodyLimit`): the body must arrive in full within ``body_timeout`` of its first read,
  else 408 and the connection is closed (a client dripping one byte at a time cannot hold a worker forever).
- **Slow or missing request head** (:class:`LimitedH11Protocol`): uvicorn has no header-read timeout, so a
  slowloris client sending one header byte a second keeps its socket open for ever. The subclass arms a timer
  whenever the connection waits for a request head (on connect, and after each response) and closes the
  connection if the head is not complete in time. The head's size is bounded by h11 (16 KiB, then 400).
- **Idle keep-alive**: uvicorn's ``timeout_keep_alive``.
- **Connection cap** (:class:`LimitedH11Protocol`): past ``max_connections`` open connections (or running
  requests) a new request or WebSocket upgrade is answered 503 with ``Retry-After``. uvicorn's own
  ``limit_concurrency`` counts the same way but answers plain text and lets WebSocket upgrades through.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import anyio
import h11
import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from shared.settings.model import ApiSettings

log = logging.getLogger("agentpost.web.limits")

#: Sent with every refusal made here, so the client knows when to try again.
RETRY_AFTER_SECONDS = 5


@dataclass(frozen=True)
class ConnectionLimits:
    """The per-connection limits of one server (defaults: :class:`~shared.settings.model.ApiSettings`)."""

    max_body_bytes: int = ApiSettings().max_body_bytes
    header_timeout: float = ApiSettings().header_timeout_seconds
    body_timeout: float = ApiSettings().body_timeout_seconds
    idle_timeout: int = ApiSettings().idle_timeout_seconds
    max_connections: int = ApiSettings().max_connections

    @classmethod
    def from_settings(cls, api: ApiSettings) -> ConnectionLimits:
        return cls(
            max_body_bytes=api.max_body_bytes,
            header_timeout=api.header_timeout_seconds,
            body_timeout=api.body_timeout_seconds,
            idle_timeout=api.idle_timeout_seconds,
            max_connections=api.max_connections,
        )


def _json_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


async def _refuse(send: Send, status: int, message: str, *, retry_after: bool = False) -> None:
    """Answer ``{"error": message}`` and close the connection afterwards (the rest of the request is junk)."""
    body = _json_body(message)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if retry_after:
        headers.append((b"retry-after", str(RETRY_AFTER_SECONDS).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _TooLarge(Exception):
    pass


class _TooSlow(Exception):
    pass


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413 (whether or not a Content-Length was sent) and bodies
    that take longer than ``timeout`` seconds with 408; both close the connection."""

    def __init__(self, app: ASGIApp, limit: int, timeout: float = ConnectionLimits.body_timeout) -> None:
        self.app = app
        self.limit = limit
        self.timeout = timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"the request body is larger than {self.limit} bytes"
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            if not length.isdigit():
                await _refuse(send, 400, "invalid Content-Length header")
                return
            if int(length) > self.limit:
                await _refuse(send, 413, too_large)
                return
        seen = 0
        body_done = False
        deadline: float | None = None
        refusal: tuple[int, str] | None = None
        started = False

        async def limited_receive() -> Message:
            nonlocal seen, body_done, deadline, refusal
            if body_done:
                return await receive()  # only http.disconnect is left: a stream waits here, unbounded
            if deadline is None:
                deadline = anyio.current_time() + self.timeout
            try:
                with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                    message = await receive()
            except TimeoutError:
                refusal = (408, f"the request body did not arrive within {self.timeout:g} seconds")
                raise _TooSlow from None
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    refusal = (413, too_large)
                    raise _TooLarge
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if refusal is not None:
                return  # the framework's answer to the aborted read is replaced by the refusal below
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with suppress(_TooLarge, _TooSlow):
            await self.app(scope, limited_receive, tracking_send)
        if refusal is not None:
            if started:
                raise RuntimeError("request body refused after the response had started")  # uvicorn closes
            await _refuse(send, *refusal)


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head and a connection cap answered in JSON.

    Configure through :func:`protocol_class` (uvicorn builds one instance per connection from the class)."""

    header_timeout: float = ConnectionLimits.header_timeout
    max_connections: int = ConnectionLimits.max_connections

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = False  # some bytes of the awaited head arrived (a 408 is then worth sending)
        app = self.app

        async def capped(scope: Scope, receive: Receive, send: Send) -> None:
            # This request's task and connection are counted already, hence ">".
            if self._over_cap():
                log.warning("refused a request: %d connections open (the cap)", len(self.connections))
                await _refuse(
                    send, 503, "the server has too many open connections; retry shortly", retry_after=True
                )
                return
            await app(scope, receive, send)

        self.app = capped

    def _over_cap(self) -> bool:
        return len(self.connections) > self.max_connections or len(self.tasks) > self.max_connections

    # -- the request-head deadline ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None:
            self._head_bytes = True
        super().data_received(data)
        self._watch_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        """Arm the timer while a request head is awaited (h11 says the client is ``IDLE``), else disarm it.
        An armed timer keeps its deadline: bytes trickling in do not extend it."""
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            self._stop_head_timer()
        elif self._head_timer is None:
            self._head_bytes = False
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self._head_bytes:
            # h11 cannot answer a request it has not parsed, so the 408 is written by hand.
            body = _json_body(f"the request headers did not arrive within {self.header_timeout:g} seconds")
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
        self.transport.close()

    # -- the cap for WebSocket upgrades (uvicorn hands those over before any app runs) ------------------------
    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        if not self._over_cap():
            super().handle_websocket_upgrade(event)
            return
        log.warning("refused a WebSocket: %d connections open (the cap)", len(self.connections))
        body = _json_body("the server has too many open connections; retry shortly")
        headers = [
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
            ("connection", "close"),
            ("retry-after", str(RETRY_AFTER_SECONDS)),
        ]
        for part in (h11.Response(status_code=503, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(part) or b"")
        self.transport.close()


def protocol_class(limits: ConnectionLimits) -> type[LimitedH11Protocol]:
    """A :class:`LimitedH11Protocol` subclass bound to ``limits`` (uvicorn takes a class, not an instance)."""
    return type(
        "BoundedH11Protocol",
        (LimitedH11Protocol,),
        {"header_timeout": limits.header_timeout, "max_connections": limits.max_connections},
    )


def server_config(
    app: ASGIApp, *, host: str, port: int, limits: ConnectionLimits, **options: Any
) -> uvicorn.Config:
    """The uvicorn configuration of an agentpost HTTP server: ``limits`` applied, the rest from ``options``.

    The app itself must refuse large or slow bodies (wrap it in :class:`BodyLimit`); everything about the
    connection is set here."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=protocol_class(limits),
        timeout_keep_alive=limits.idle_timeout,
        **options,
    )


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server run inside a process that owns SIGTERM/SIGINT itself (a channel adapter's webhook):
    uvicorn must not take the signals over."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def start_webhook_server(
    app: ASGIApp, api: ApiSettings, *, host: str, port: int, max_body: int, name: str
) -> tuple[EmbeddedServer, asyncio.Task[None]]:
    """Serve a channel adapter's webhook ``app`` on ``host:port`` inside the adapter's process, under the web
    API's connection limits (``api``): the body capped at ``max_body`` bytes while it is read, so an oversized
    POST gets 413 before its signature is checked and is never held in memory. Returns once it listens;
    raises what stopped it from starting."""
    limits = ConnectionLimits.from_settings(api)
    config = server_config(
        BodyLimit(app, max_body, limits.body_timeout),
        host=host,
        port=port,
        limits=limits,
        log_level="warning",
        lifespan="off",
        access_log=False,
    )
    server = EmbeddedServer(config)
    task = asyncio.create_task(server.serve(), name=name)
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError(f"the {name} server did not start on port {port}")
        await asyncio.sleep(0.02)
    return server, task
