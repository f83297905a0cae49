"""``/api/events/ws``: seed 001's subscription protocol over a WebSocket.

Client → server (JSON text frames):

- ``{"type": "queue_subscribe", "topic": "queue", "clientId": "c1", "afterCursor": "41"}`` — replay after
  the cursor, then live (``topic`` ``"*"`` or missing: every topic; ``afterCursor`` missing or null: from now
  on). ``clientId`` (AgentX's name; ``consumer`` is accepted too) is the durable consumer its acks are
  stored under; the connection remembers it for later frames;
- ``{"type": "queue_ack", "topic": "queue", "cursor": "57", "clientId": "c1"}`` — record progress;
- ``{"type": "queue_unsubscribe", "topic": "queue"}``.

Server → client (AgentX's shapes): ``{"type": "queue_entry", "topic", "cursor", "event": {"type", ...},
"timestamp"}`` (``topic`` is the subscription's, so a client can ack and resume by it; the event's own topic
is inside), ``{"type": "queue_subscribed", "topic", "latestCursor"}`` (the topic's newest cursor, ``null``
for an empty topic), ``{"type": "queue_reset", "topic", "cursor", "retainedAfter"}`` when a cursor is older
than the retained log, ``queue_unsubscribed`` / ``queue_acked`` confirmations and ``{"type": "error",
"error": "..."}``.

Each subscription follows the log like the SSE stream (see :mod:`adapters.web.stream`); a client that does not
take its frames for ``send_timeout`` seconds is closed with code 1013 and resumes from its last cursor.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import anyio
from anyio.abc import TaskGroup
from starlette.websockets import WebSocket, WebSocketDisconnect

from shared.aio import call
from shared.events.entries import ALL_TOPICS, EventEntry, EventLog
from shared.storage.db import lock_wait_limit
from shared.storage.errors import storage_problem

from .dialect import event_data
from .stream import ChangeSignal, Reset, StreamLimits, StreamStats, follow, valid_cursor

log = logging.getLogger("agentpost.web.ws")

MAX_FRAME_BYTES = 64 * 1024
MAX_SUBSCRIPTIONS = 16
CONSUMER_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,100}$")


class _TooSlow(Exception):
    pass


class _Gone(Exception):
    pass


async def serve_websocket(
    websocket: WebSocket, events: EventLog, signal: ChangeSignal, limits: StreamLimits, stats: StreamStats
) -> None:
    """Run one WebSocket connection until the client leaves (or is too slow)."""
    await websocket.accept()
    stats.clients += 1
    stats.connections_total += 1
    connection = _Connection(websocket, events, signal, limits, stats)
    try:
        async with anyio.create_task_group() as tg:
            await connection.receive_frames(tg)
            tg.cancel_scope.cancel()
    except* _TooSlow:
        log.warning("websocket client accepted nothing for %.1fs: closing it", limits.send_timeout)
        with anyio.move_on_after(1):
            await websocket.close(code=1013, reason="too slow: reconnect and resume from your last cursor")
    except* _Gone:
        pass  # the client left while we were sending to it
    finally:
        stats.clients -= 1


class _Connection:
    """One client's subscriptions, the consumer its acks are stored under, and the one way to send to it."""

    def __init__(
        self,
        websocket: WebSocket,
        events: EventLog,
        signal: ChangeSignal,
        limits: StreamLimits,
        stats: StreamStats,
    ) -> None:
        self.websocket = websocket
        self.events = events
        self.signal = signal
        self.limits = limits
        self.stats = stats
        self.send_lock = anyio.Lock()
        self.subscriptions: dict[str, anyio.CancelScope] = {}
        self.client_id = "ws"  # the consumer acks are stored under, until the client names itself

    async def send(self, data: dict[str, Any]) -> None:
        async with self.send_lock:
            try:
                with anyio.fail_after(self.limits.send_timeout):
                    await self.websocket.send_text(json.dumps(data, separators=(",", ":")))
            except TimeoutError:
                self.stats.slow_disconnects_total += 1
                raise _TooSlow from None
            except (WebSocketDisconnect, RuntimeError, OSError):
                raise _Gone from None

    async def receive_frames(self, tg: TaskGroup) -> None:
        """Answer the client's frames until it leaves; an invalid frame or an ack the database could not
        store is answered with an error frame, and the connection stays open."""
        while True:
            try:
                raw = await self.websocket.receive_text()
            except (WebSocketDisconnect, RuntimeError, KeyError):
                return
            if len(raw) > MAX_FRAME_BYTES:
                await self.send({"type": "error", "error": f"frame larger than {MAX_FRAME_BYTES} bytes"})
                continue
            try:
                await self.handle(json.loads(raw), tg)
            except (ValueError, TypeError) as exc:
                await self.send({"type": "error", "error": str(exc)})
            except Exception as exc:
                # The database in trouble (an ack that could not be stored): say so and stay connected.
                problem = storage_problem(exc)
                if problem is None:
                    raise
                await self.send(
                    {"type": "error", "error": problem.public(), "retryAfter": problem.retry_after}
                )

    async def handle(self, msg: Any, tg: TaskGroup) -> None:
        """One frame of the client (raises :class:`ValueError` with the reason for an invalid one)."""
        if not isinstance(msg, dict):
            raise ValueError("a frame must be a JSON object")
        kind = msg.get("type")
        topic_key = str(msg.get("topic") or ALL_TOPICS)
        if len(topic_key) > 100:
            raise ValueError("topic too long")
        named = _opt_str(msg.get("clientId") or msg.get("consumer"))
        if named:
            if not CONSUMER_RE.match(named):
                raise ValueError("clientId: 1 to 100 letters, digits or . _ : -")
            self.client_id = named
        if kind == "queue_subscribe":
            await self.subscribe(topic_key, valid_cursor(_opt_str(msg.get("afterCursor"))), tg)
        elif kind == "queue_unsubscribe":
            found = self.subscriptions.pop(topic_key, None)
            if found is not None:
                found.cancel()
            await self.send({"type": "queue_unsubscribed", "topic": topic_key})
        elif kind == "queue_ack":
            cursor = valid_cursor(_opt_str(msg.get("cursor")))
            if cursor is None:
                raise ValueError("queue_ack needs a cursor")
            await call(_ack, self.events, self.client_id, topic_key, cursor, self.limits)
            await self.send({"type": "queue_acked", "topic": topic_key, "cursor": cursor})
        else:
            raise ValueError(f"unknown message type {kind!r}")

    async def subscribe(self, topic_key: str, after: str | None, tg: TaskGroup) -> None:
        if topic_key in self.subscriptions:
            raise ValueError(f"already subscribed to {topic_key!r}; unsubscribe first")
        if len(self.subscriptions) >= MAX_SUBSCRIPTIONS:
            raise ValueError(f"at most {MAX_SUBSCRIPTIONS} subscriptions per connection")
        scope = anyio.CancelScope()
        self.subscriptions[topic_key] = scope
        latest = await call(self.events.latest_cursor, None if topic_key == ALL_TOPICS else topic_key)
        if after is None:
            # "From now on" starts here, before the confirmation: whatever is appended once the client holds
            # queue_subscribed reaches it.
            after = await call(self.events.last_cursor)
        await self.send({"type": "queue_subscribed", "topic": topic_key, "latestCursor": latest})
        tg.start_soon(self.run_subscription, topic_key, after, scope)

    async def run_subscription(self, topic_key: str, after: str | None, scope: anyio.CancelScope) -> None:
        topic = None if topic_key == ALL_TOPICS else topic_key
        with scope:
            async for item in follow(self.events, self.signal, topic, after, self.limits):
                if item is None:
                    continue
                if isinstance(item, Reset):
                    self.stats.resets_total += 1
                    await self.send(
                        {
                            "type": "queue_reset",
                            "topic": topic_key,
                            "cursor": item.cursor,
                            "retainedAfter": item.retained_after,
                        }
                    )
                    continue
                for entry in item:
                    await self.send(_entry_frame(topic_key, entry))
                self.stats.events_sent_total += len(item)


def _entry_frame(topic_key: str, entry: EventEntry) -> dict[str, Any]:
    return {
        "type": "queue_entry",
        "topic": topic_key,
        "cursor": entry.cursor,
        "event": event_data(entry),
        "timestamp": entry.created_at,
    }


def _ack(events: EventLog, consumer: str, topic: str, cursor: str, limits: StreamLimits) -> None:
    # A lock held elsewhere costs this client a moment and an error frame, not the busy timeout.
    with lock_wait_limit(int(limits.lock_wait * 1000)):
        events.ack(consumer, topic, cursor)


def _opt_str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError("cursors are strings")
    return value
