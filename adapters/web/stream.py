"""The live event stream: replay from a cursor, then follow the log, with no gap and no duplicate.

How it stays loss-free: a follower never keeps its own copy of "live" events. It reads the durable log from
the last cursor it sent, page by page, until a read comes back short; then it waits for the process's change
signal (:class:`~shared.events.wake.Waker`) and reads again from that same cursor. Cursors are assigned in commit
order, so a read after cursor N returns every event that committed after N — including those appended while
the client was replaying — and nothing it already has.

How a slow client is contained: events are pulled from the log at the client's pace, so nothing queues up in
memory for it — at most one page plus the transport's write buffer (uvicorn pauses writing at 64 KiB). A client
that accepts nothing for ``send_timeout`` seconds is cut off; it reconnects with ``Last-Event-ID`` and resumes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from starlette.responses import Response

from shared.aio import call
from shared.clock import now_ms
from shared.events.entries import CursorExpired, EventEntry, parse_cursor
from shared.storage.errors import storage_problem

from .dialect import event_json, event_name

log = logging.getLogger("agentpost.web.stream")

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


class ReadableLog(Protocol):
    """The part of an event log a follower needs."""

    def read(self, topic: str | None, after: str | None = None, limit: int = 100) -> list[EventEntry]: ...

    def last_cursor(self) -> str: ...


class ChangeSignal(Protocol):
    """The part of :class:`~shared.events.wake.Waker` a follower needs."""

    @property
    def generation(self) -> int: ...

    async def wait_async(self, since: int, timeout: float) -> int: ...


@dataclass(frozen=True)
class StreamLimits:
    """Tuning of live streams."""

    page_size: int = 200
    #: A client that takes no data for this long is disconnected (it can resume from its cursor).
    send_timeout: float = 10.0
    #: Seconds of silence after which a keep-alive comment is sent.
    heartbeat: float = 15.0
    #: Concurrent stream clients per process; more are refused with 503.
    max_clients: int = 256
    #: Seconds between reads while the database is in trouble (locked, unreachable); the stream stays open.
    storage_retry: float = 1.0
    #: The most a write made for a stream client (a WebSocket ``queue_ack``) waits for another process's
    #: lock before the client is told to try again (see :func:`shared.storage.db.lock_wait_limit`).
    lock_wait: float = 2.0


@dataclass
class StreamStats:
    """Counters for /metrics."""

    clients: int = 0
    connections_total: int = 0
    events_sent_total: int = 0
    slow_disconnects_total: int = 0
    resets_total: int = 0
    by_transport: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Reset:
    """The client's cursor is older than the retained log; it continues from ``retained_after``."""

    cursor: str
    retained_after: str


#: What a follower yields: a page of events, a reset notice, or ``None`` for "nothing new lately".
Item = list[EventEntry] | Reset | None


def valid_cursor(value: str | None) -> str | None:
    """Return the cursor in canonical form if this log could have handed it out (a whole number from 0 to
    2^63−1), ``None`` for none given, else raise :class:`ValueError` with a message for the client."""
    if value is None or value == "":
        return None
    return str(parse_cursor(value))


async def follow(
    events: ReadableLog,
    signal: ChangeSignal,
    topic: str | None,
    after: str | None,
    limits: StreamLimits,
) -> AsyncIterator[Item]:
    """Yield pages of events after ``after`` (``None``: from now on), forever, in cursor order.

    Storage trouble (the database locked, unreachable, …) pauses the follower instead of ending it: it
    yields keep-alives and reads again from the same cursor until the database answers, so the client
    neither loses its place nor has to reconnect."""
    cursor = after
    while cursor is None:
        try:
            cursor = await call(events.last_cursor)
        except Exception as exc:
            await _pause_for(exc, limits)
            yield None
    while True:
        # Take the generation before reading: a change that lands between the read and the wait is seen.
        generation = signal.generation
        try:
            batch = await call(events.read, topic, cursor, limits.page_size)
        except CursorExpired as exc:
            yield Reset(cursor, exc.retained_after)
            cursor = exc.retained_after
            continue
        except Exception as exc:
            await _pause_for(exc, limits)
            yield None
            continue
        if batch:
            cursor = batch[-1].cursor
            yield batch
            if len(batch) >= limits.page_size:
                continue
        if await signal.wait_async(generation, limits.heartbeat) == generation:
            yield None


async def _pause_for(exc: Exception, limits: StreamLimits) -> None:
    """Wait out storage trouble before the next read; re-raise anything else."""
    problem = storage_problem(exc)
    if problem is None:
        raise exc
    log.warning("event stream paused: %s (%s)", problem.describe(), problem.detail)
    await anyio.sleep(min(limits.storage_retry, problem.retry_after))


def entry_json(entry: EventEntry) -> str:
    """The JSON body of one event as clients see it (see :func:`adapters.web.dialect.event_data`)."""
    return event_json(entry)


def connected_frame(cursor: str | None) -> bytes:
    """The ``connected`` event TinyAGI's clients wait for before they poll (no ``id:``: it is no event of
    the log, so it leaves the browser's Last-Event-ID alone)."""
    body = json.dumps({"type": "connected", "timestamp": now_ms(), "cursor": cursor}, separators=(",", ":"))
    return f"event: connected\ndata: {body}\n\n".encode()


def sse_frames(item: Item) -> bytes:
    """Encode one follower item as server-sent events: every event carries ``id:`` (its cursor) and
    ``event:`` (its name, TinyAGI's where it has one: see :mod:`adapters.web.dialect`)."""
    if item is None:
        return b": keep-alive\n\n"
    if isinstance(item, Reset):
        body = json.dumps({"cursor": item.cursor, "retainedAfter": item.retained_after})
        return f"event: reset\nid: {item.retained_after}\ndata: {body}\n\n".encode()
    return "".join(
        f"id: {e.cursor}\nevent: {event_name(e)}\ndata: {entry_json(e)}\n\n" for e in item
    ).encode()


class EventStreamResponse(Response):
    """An ASGI response that streams the log as SSE, stops when the client leaves, and cuts off a client
    that accepts nothing for ``limits.send_timeout`` seconds."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: ReadableLog,
        signal: ChangeSignal,
        topic: str | None,
        after: str | None,
        limits: StreamLimits,
        stats: StreamStats,
    ) -> None:
        self.events = events
        self.signal = signal
        self.topic = topic
        self.after = after
        self.limits = limits
        self.stats = stats
        super().__init__(
            content=None,
            status_code=200,
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            media_type="text/event-stream",
        )
        # The body is open-ended: no Content-Length (Response adds one for its empty default body).
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": self.raw_headers,
            }
        )
        self.stats.clients += 1
        self.stats.connections_total += 1
        completed = False
        try:
            async with anyio.create_task_group() as tg:

                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(watch_disconnect)
                completed = await self._pump(send)
                tg.cancel_scope.cancel()
        finally:
            self.stats.clients -= 1
        if completed:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send) -> bool:
        # The first frame tells EventSource how soon to reconnect after a cut; then ``connected``.
        # A client that starts "from now" gets its starting point fixed before ``connected``: whatever is
        # appended after it has seen ``connected`` reaches it.
        start = self.after
        if start is None:
            try:
                start = await call(self.events.last_cursor)
            except Exception as exc:
                if storage_problem(exc) is None:
                    raise
                start = None  # the follower waits the trouble out and starts from then
        if not await self._send(send, b"retry: 1000\n\n" + connected_frame(start)):
            return False
        async for item in follow(self.events, self.signal, self.topic, start, self.limits):
            if isinstance(item, Reset):
                self.stats.resets_total += 1
            if not await self._send(send, sse_frames(item)):
                return False
            if isinstance(item, list):
                self.stats.events_sent_total += len(item)
        return True

    async def _send(self, send: Send, body: bytes) -> bool:
        try:
            with anyio.fail_after(self.limits.send_timeout):
                await send({"type": "http.response.body", "body": body, "more_body": True})
        except TimeoutError:
            # Returning without finishing the body makes the server close the connection; the client's
            # cursor (the last id it received) is all it needs to resume.
            self.stats.slow_disconnects_total += 1
            log.warning(
                "event stream client accepted nothing for %.1fs: disconnecting it", self.limits.send_timeout
            )
            return False
        return True
