"""The event log over HTTP: ``/api/events`` (a page after a cursor), ``/api/events/ack`` (a durable consumer's
progress), ``/api/events/stream`` (server-sent events) and ``/api/events/ws`` (AgentX's WebSocket protocol)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, WebSocket
from fastapi.responses import Response
from pydantic import Field

from shared.events.entries import ALL_TOPICS, CursorExpired

from .auth import admit_websocket
from .dialect import event_data
from .errors import ApiError
from .params import CONSUMER_PATTERN, CURSOR_MAX_LENGTH, TOPIC_PATTERN, Body
from .state import Web, web_state
from .stream import EventStreamResponse, valid_cursor
from .websocket import serve_websocket

#: The ``/api`` routes (behind the token check of the ``/api`` router).
router = APIRouter()
#: The WebSocket route: its handshake is checked by :func:`~adapters.web.auth.admit_websocket`.
websocket_router = APIRouter()

Cursor = Annotated[str | None, Query(max_length=CURSOR_MAX_LENGTH)]
Topic = Annotated[str | None, Query(pattern=TOPIC_PATTERN)]


class EventAckIn(Body):
    """``POST /api/events/ack``: a durable consumer's progress."""

    consumer: str = Field(pattern=CONSUMER_PATTERN)
    topic: str = Field(pattern=TOPIC_PATTERN)
    cursor: str = Field(min_length=1, max_length=CURSOR_MAX_LENGTH)


def checked_cursor(value: str | None, where: str) -> str | None:
    """A client's cursor, checked: 400 naming ``where`` it came from when this server never hands it out."""
    try:
        return valid_cursor(value)
    except ValueError as exc:
        raise ApiError(400, f"{where}: {exc}") from None


def topic_filter(topic: str | None) -> str | None:
    """The log's topic filter for a client's ``topic`` (``None``: every topic)."""
    return None if topic in (None, "", ALL_TOPICS) else topic


@router.get("/events", summary="A page of events after a cursor")
async def events_page(
    web: Web, after: Cursor = None, topic: Topic = None, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> dict[str, Any]:
    after = checked_cursor(after, "after")
    try:
        batch = await web.run(web.events.read, topic_filter(topic), after, limit)
    except CursorExpired as exc:
        raise ApiError(410, str(exc), reset=True, retainedAfter=exc.retained_after) from None
    cursor = batch[-1].cursor if batch else (after or "0")
    return {"events": [event_data(e) for e in batch], "cursor": cursor}


@router.post("/events/ack", summary="Record a durable consumer's cursor")
async def events_ack(body: EventAckIn, web: Web) -> dict[str, Any]:
    cursor = checked_cursor(body.cursor, "cursor")
    if cursor is None:  # not reached: the body's cursor is never empty
        raise ApiError(400, "cursor: give the cursor to record")
    await web.run(web.events.ack, body.consumer, body.topic, cursor)
    return {"ok": True}


@router.get(
    "/events/stream",
    summary="Live events as server-sent events (replay from Last-Event-ID or ?after=, then live)",
    response_class=Response,
)
async def events_stream(request: Request, web: Web, after: Cursor = None, topic: Topic = None) -> Any:
    header = request.headers.get("last-event-id")
    cursor = checked_cursor(header, "Last-Event-ID") if header else checked_cursor(after, "after")
    if web.stats.clients >= web.limits.max_clients:
        raise ApiError(503, "too many stream clients; retry later", headers={"Retry-After": "5"})
    return EventStreamResponse(
        web.events, web.runtime.waker, topic_filter(topic), cursor, web.limits, web.stats
    )


@websocket_router.websocket("/api/events/ws")
async def events_ws(websocket: WebSocket) -> None:
    if not await admit_websocket(websocket):
        return
    web = web_state(websocket)
    await serve_websocket(websocket, web.events, web.runtime.waker, web.limits, web.stats)
