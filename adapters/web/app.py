"""The HTTP API, live streams and dashboard as one FastAPI application over an open runtime.

Endpoint names and shapes follow seed 000 (request fields in camelCase, rows with their column names). Every
error is a JSON object ``{"error": "..."}`` with a 4xx status, and a failed request changes nothing.

Storage trouble (the database locked by another program, a full disk, a read-only file, PostgreSQL out of
reach) is a temporary refusal, never a 500: ``503`` with ``Retry-After`` and a plain sentence. A request waits
at most ``storage_wait_seconds`` for another process's lock rather than the database's whole busy timeout
(30 s by default), so a held lock costs each caller a moment, not half a minute.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio.to_thread
import psycopg
from fastapi import APIRouter, Depends, FastAPI, Query, Request, WebSocket
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared import api_views
from shared.clock import now_ms
from shared.db import lock_wait_limit
from shared.events import ALL_TOPICS, CursorExpired, EventLog
from shared.file_access import check_send_path, send_roots
from shared.ids import MESSAGE_ID_RE
from shared.queue_types import (
    MAX_MESSAGE_CHARS,
    InvalidInput,
    LeaseLost,
    NotFound,
    QueueError,
    RetryBudgetExhausted,
)
from shared.runtime import Runtime
from shared.storage_errors import storage_problem

from .auth import bearer_token, host_header_is_loopback, token_matches
from .console import console_router
from .dialect import (
    AckOut,
    ChatMessageOut,
    ChatPosted,
    KillOut,
    MessageAccepted,
    ProactiveAccepted,
    ProcessingOut,
    QueueStatusOut,
    ResponseOut,
    event_data,
    processing_out,
    response_out,
)
from .errors import ApiError
from .limits import BodyLimit
from .manage import management_router
from .metrics import Metrics
from .origins import OriginGuard
from .stream import EventStreamResponse, StreamLimits, StreamStats, valid_cursor
from .websocket import serve_websocket

log = logging.getLogger("agentpost.web")

STATIC_DIR = Path(__file__).parent / "static"
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
#: Cursors are checked by :func:`~adapters.web.stream.valid_cursor` (400 with a reason), not by a pattern
#: (a bare 422 "should match pattern" says nothing about the range); this only bounds the length.
CURSOR_MAX_LENGTH = 100
#: Default for ``create_app(storage_wait_seconds=...)``: how long a request waits for another process's lock.
DEFAULT_STORAGE_WAIT_SECONDS = 2.0
TOPIC_PATTERN = r"^[A-Za-z0-9_.:*-]{1,100}$"
CONSUMER_PATTERN = r"^[A-Za-z0-9_.:-]{1,100}$"

DeadRef = Annotated[str, PathParam(pattern=r"^([0-9]{1,18}|" + MESSAGE_ID_RE.pattern[1:-1] + ")$")]
TeamName = Annotated[str, PathParam(pattern=NAME_PATTERN)]


# -- request bodies --------------------------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=False)


class MessageIn(_Body):
    """``POST /api/message``: queue a message (seed 000's fields)."""

    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    agent: str | None = Field(default=None, pattern=NAME_PATTERN)
    sender: str = Field(default="web", max_length=200)
    senderId: str = Field(default="", max_length=200)
    channel: str = Field(default="web", pattern=NAME_PATTERN)
    messageId: str | None = Field(default=None, pattern=MESSAGE_ID_RE.pattern)
    conversation: str = Field(default="", max_length=500)


class ProactiveIn(_Body):
    """``POST /api/responses``: send a message nobody asked for."""

    channel: str = Field(pattern=NAME_PATTERN)
    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    sender: str = Field(default="", max_length=200)
    senderId: str = Field(default="", max_length=200)
    conversation: str = Field(default="", max_length=500)
    agent: str = Field(default="", max_length=32)
    files: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=10)


class ChatPostIn(_Body):
    """``POST /api/chatroom/{team}``: a user's post to a team's chat room."""

    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    sender: str = Field(default="web", max_length=200)


class EventAckIn(_Body):
    """``POST /api/events/ack``: a durable consumer's progress."""

    consumer: str = Field(pattern=CONSUMER_PATTERN)
    topic: str = Field(pattern=TOPIC_PATTERN)
    cursor: str = Field(min_length=1, max_length=CURSOR_MAX_LENGTH)


# -- errors ----------------------------------------------------------------------------------------------
def _error(status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def _cursor(value: str | None, where: str) -> str | None:
    """A client's cursor, checked: 400 naming ``where`` it came from when this server never hands it out."""
    try:
        return valid_cursor(value)
    except ValueError as exc:
        raise ApiError(400, f"{where}: {exc}") from None


_QUEUE_STATUS: list[tuple[type[QueueError], int]] = [
    (NotFound, 404),
    (RetryBudgetExhausted, 409),
    (LeaseLost, 409),
    (InvalidInput, 400),
]


def _describe_validation(exc: RequestValidationError) -> tuple[int, str, list[dict[str, Any]]]:
    details = []
    for err in exc.errors():
        if err.get("type") == "json_invalid":
            return 400, "malformed JSON in the request body", []
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        details.append({"field": ".".join(loc) or "body", "problem": err.get("msg", "invalid")})
    summary = "; ".join(f"{d['field']}: {d['problem']}" for d in details) or "invalid request"
    return 422, summary, details


# -- the application ---------------------------------------------------------------------------------------
def create_app(
    runtime: Runtime,
    *,
    events: EventLog | None = None,
    limits: StreamLimits | None = None,
    max_body_bytes: int | None = None,
    storage_wait_seconds: float = DEFAULT_STORAGE_WAIT_SECONDS,
) -> FastAPI:
    """Build the web adapter over ``runtime``. ``events`` overrides the event log read by streams (the Redis
    driver, say); by default the runtime's SQL log is used. ``storage_wait_seconds`` bounds how long one
    request waits for a lock another process holds before it is answered 503. ``max_body_bytes`` overrides
    ``api.max_body_bytes``."""
    settings = runtime.settings
    queue = runtime.queue
    db = runtime.db
    event_log: EventLog = events if events is not None else runtime.events
    limits = limits or StreamLimits()
    stats = StreamStats()
    metrics = Metrics(queue, event_log, stats)
    token = settings.api.token

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        runtime.waker  # noqa: B018 - start the change signal before the first stream needs it
        await anyio.to_thread.run_sync(metrics.start)
        yield

    app = FastAPI(
        title="agentpost",
        version="0.1.0",
        description="Queue, stream and steer AI coding agents.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.runtime = runtime
    app.state.events = event_log
    app.state.stream_stats = stats
    app.state.limits = limits

    async def guard(request: Request) -> None:
        """Token check for every ``/api`` route (also used by the stream, which accepts ``?token=``)."""
        if token:
            given = bearer_token(request.headers) or request.query_params.get("token")
            if not token_matches(given, token):
                raise ApiError(401, "missing or wrong API token (send Authorization: Bearer <token>)")
        elif not host_header_is_loopback(request.headers):
            raise ApiError(403, "without an API token the API answers only requests addressed to loopback")

    api = APIRouter(prefix="/api", dependencies=[Depends(guard)])

    wait_ms = max(0, int(storage_wait_seconds * 1000))

    def bounded(fn: Any, *args: Any, **kwargs: Any) -> Any:
        with lock_wait_limit(wait_ms):
            return fn(*args, **kwargs)

    async def run(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(lambda: bounded(fn, *args, **kwargs))

    # -- messages ----------------------------------------------------------------------------------------
    @api.post("/message", status_code=201, summary="Queue a message")
    async def post_message(body: MessageIn) -> MessageAccepted:
        result = await run(
            queue.enqueue_message,
            body.channel,
            body.sender,
            body.message,
            sender_id=body.senderId,
            message_id=body.messageId,
            agent=body.agent,
            conversation=body.conversation,
        )
        if result.duplicate:
            raise ApiError(
                409,
                f"message id {result.message_id} is already queued",
                ok=False,
                messageId=result.message_id,
                agent=result.agent,
                duplicate=True,
            )
        return MessageAccepted(ok=True, messageId=result.message_id, agent=result.agent, duplicate=False)

    @api.get("/queue/status", summary="Messages per status and undelivered responses")
    async def queue_status() -> QueueStatusOut:
        def read() -> QueueStatusOut:
            s = queue.queue_status()
            outgoing = s["responses_pending"] + s["responses_delivering"]
            return QueueStatusOut(
                incoming=s["pending"],
                queued=s["pending"],
                outgoing=outgoing,
                activeConversations=api_views.active_conversations(db),
                **s,
            )

        status: QueueStatusOut = await run(read)
        return status

    @api.get("/queue/agents", summary="Pending and processing messages per agent")
    async def queue_agents() -> list[dict[str, Any]]:
        depths: list[dict[str, Any]] = await run(queue.agent_queue_depths)
        return depths

    @api.get("/queue/processing", summary="Messages being processed now")
    async def queue_processing() -> list[ProcessingOut]:
        now = now_ms()
        return [processing_out(m, now) for m in await run(queue.list_processing)]

    @api.post("/queue/processing/{row_id}/kill", summary="Stop the run working on a message")
    async def kill_session(row_id: Annotated[int, PathParam(ge=1, le=2**62)]) -> KillOut:
        def stop() -> KillOut:
            row = api_views.processing_message(db, row_id)
            if row is None:
                raise ApiError(404, f"message {row_id} is not being processed")
            queue.request_stop(str(row["agent"]), str(row["conversation"] or "*"))
            return KillOut(ok=True, agent=str(row["agent"]), processKilled=row["run_started_at"] is not None)

        result: KillOut = await run(stop)
        return result

    @api.get("/queue/dead", summary="Dead letters, newest first")
    async def queue_dead(
        limit: Annotated[int, Query(ge=1, le=1000)] = 100, offset: Annotated[int, Query(ge=0, le=10**9)] = 0
    ) -> list[dict[str, Any]]:
        return [m.as_dict() for m in await run(queue.list_dead, limit, offset)]

    @api.post("/queue/dead/{ref}/retry", summary="Retry a dead letter (row id or message id)")
    async def retry_dead(ref: DeadRef) -> dict[str, Any]:
        row = await run(queue.retry_dead, ref)
        return {"ok": True, "message": row.as_dict()}

    @api.delete("/queue/dead/{ref}", summary="Delete a dead letter for good")
    async def delete_dead(ref: DeadRef) -> dict[str, Any]:
        row = await run(queue.delete_dead, ref)
        return {"ok": True, "messageId": row.message_id}

    # -- responses ---------------------------------------------------------------------------------------
    @api.get("/responses", summary="Recent responses, newest first")
    async def responses(
        limit: Annotated[int, Query(ge=1, le=1000)] = 20,
        channel: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    ) -> list[ResponseOut]:
        return [response_out(r) for r in await run(queue.list_responses, limit, channel)]

    @api.get("/responses/pending", summary="Undelivered responses of one channel, oldest first")
    async def responses_pending(
        channel: Annotated[str, Query(pattern=NAME_PATTERN)],
        conversation: Annotated[str | None, Query(max_length=500)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[ResponseOut]:
        if conversation is None:
            return [response_out(r) for r in await run(queue.list_responses, limit, channel, True)]
        return [
            response_out(r)
            for r in await run(api_views.pending_chat_replies, db, channel, conversation, limit)
        ]

    @api.post("/responses/{response_id}/ack", summary="Mark a response delivered")
    async def ack_response(response_id: Annotated[int, PathParam(ge=1, le=2**62)]) -> AckOut:
        changed = await run(queue.ack_response, response_id)
        return AckOut(ok=True, acked=bool(changed))

    def checked_files(body: ProactiveIn, conversation: str) -> list[str]:
        """The files of a proactive message, each resolved and inside the roots a reply of its agent to its
        chat may send from (:mod:`shared.file_access`: the agent's workspace, that chat's uploads)."""
        current = runtime.settings  # agents added since the start (settings.toml is reloaded) count too
        roots = send_roots(current, body.agent, body.channel, conversation)
        base = current.workspace(body.agent) if body.agent in current.agents else None
        resolved = []
        for raw in body.files:
            try:
                path, reason = check_send_path(raw, roots, base)
            except (RuntimeError, ValueError, OSError) as exc:  # e.g. "~nobody/x": no such home folder
                raise ApiError(400, f"files: cannot resolve {raw!r}: {exc}", file=raw) from None
            if path is None:
                raise ApiError(400, f"files: refusing to send {raw!r}: {reason}", file=raw)
            resolved.append(path)
        return resolved

    @api.post("/responses", status_code=201, summary="Queue a proactive message")
    async def post_response(body: ProactiveIn) -> ProactiveAccepted:
        conversation = body.conversation
        if not conversation:
            if not body.senderId:
                raise ApiError(400, "give senderId (the user to write to) or conversation (the chat)")
            found = await run(api_views.chat_of_sender, db, body.channel, body.senderId)
            if found is None:
                raise ApiError(
                    400,
                    f"no chat with sender {body.senderId!r} on {body.channel} is known yet (they have not "
                    "written here lately); give conversation (the chat id)",
                )
            conversation = found
        files = await anyio.to_thread.run_sync(checked_files, body, conversation) if body.files else []
        row = await run(
            queue.enqueue_response,
            body.channel,
            body.sender,
            body.message,
            sender_id=body.senderId,
            conversation=conversation,
            agent=body.agent,
            files=files,
        )
        return ProactiveAccepted(ok=True, messageId=row.message_id, response=response_out(row))

    # -- chat rooms ---------------------------------------------------------------------------------------
    def known_team(team: str) -> None:
        teams = runtime.settings.teams
        if team not in teams:
            raise ApiError(404, f"no team {team!r} (known: {', '.join(sorted(teams)) or 'none'})")

    @api.get("/chatroom/{team}", summary="A team chat room's newest posts after ?since= (newest first)")
    async def chatroom(
        team: TeamName,
        since: Annotated[int, Query(ge=0, le=2**62)] = 0,
        after: Annotated[int | None, Query(ge=0, le=2**62, description="Same as since.")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> list[ChatMessageOut]:
        known_team(team)
        rows = await run(api_views.chat_room_posts, db, team, since_id=max(since, after or 0), limit=limit)
        return [ChatMessageOut.model_validate(r) for r in rows]

    @api.post("/chatroom/{team}", status_code=201, summary="Post to a team chat room (every member is told)")
    async def post_chatroom(team: TeamName, body: ChatPostIn) -> ChatPosted:
        known_team(team)
        members = runtime.settings.teams[team].agents
        post = await run(api_views.post_to_chat_room, queue, team, body.sender, body.message, members)
        return ChatPosted(ok=True, id=post.id, queued=post.queued)

    # -- events --------------------------------------------------------------------------------------------
    def parse_topic(topic: str | None) -> str | None:
        return None if topic in (None, "", ALL_TOPICS) else topic

    @api.get("/events", summary="A page of events after a cursor")
    async def events_page(
        after: Annotated[str | None, Query(max_length=CURSOR_MAX_LENGTH)] = None,
        topic: Annotated[str | None, Query(pattern=TOPIC_PATTERN)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> dict[str, Any]:
        after = _cursor(after, "after")
        try:
            batch = await run(event_log.read, parse_topic(topic), after, limit)
        except CursorExpired as exc:
            raise ApiError(410, str(exc), reset=True, retainedAfter=exc.retained_after) from None
        cursor = batch[-1].cursor if batch else (after or "0")
        return {"events": [event_data(e) for e in batch], "cursor": cursor}

    @api.post("/events/ack", summary="Record a durable consumer's cursor")
    async def events_ack(body: EventAckIn) -> dict[str, Any]:
        cursor = _cursor(body.cursor, "cursor")
        await run(event_log.ack, body.consumer, body.topic, cursor)
        return {"ok": True}

    @api.get(
        "/events/stream",
        summary="Live events as server-sent events (replay from Last-Event-ID or ?after=, then live)",
        response_class=Response,
    )
    async def events_stream(
        request: Request,
        after: Annotated[str | None, Query(max_length=CURSOR_MAX_LENGTH)] = None,
        topic: Annotated[str | None, Query(pattern=TOPIC_PATTERN)] = None,
    ) -> Any:
        header = request.headers.get("last-event-id")
        cursor = _cursor(header, "Last-Event-ID") if header else _cursor(after, "after")
        if stats.clients >= limits.max_clients:
            raise ApiError(503, "too many stream clients; retry later", headers={"Retry-After": "5"})
        return EventStreamResponse(event_log, runtime.waker, parse_topic(topic), cursor, limits, stats)

    api.include_router(management_router(runtime, run, settings.api.port))
    api.include_router(console_router(runtime, run))
    app.include_router(api)

    @app.websocket("/api/events/ws")
    async def events_ws(websocket: WebSocket) -> None:
        if token:
            given = bearer_token(websocket.headers) or websocket.query_params.get("token")
            if not token_matches(given, token):
                await websocket.close(code=4401, reason="missing or wrong API token")
                return
        elif not host_header_is_loopback(websocket.headers):
            await websocket.close(code=4403, reason="loopback only without an API token")
            return
        await serve_websocket(websocket, event_log, runtime.waker, limits, stats)

    # -- health, metrics, dashboard ----------------------------------------------------------------------
    @app.get("/healthz", summary="Liveness and database reachability")
    async def healthz() -> JSONResponse:
        try:
            await run(db.read_scalar, "SELECT 1")
        except Exception as exc:  # an unreachable database is what this endpoint exists to report
            problem = storage_problem(exc, db.url)
            if problem is not None:
                return _error(503, problem.public(), headers={"Retry-After": str(problem.retry_after)})
            return _error(503, f"database unreachable: {type(exc).__name__}", headers={"Retry-After": "5"})
        return JSONResponse({"ok": True, "database": db.dialect.name})

    @app.get("/access", summary="Whether this server asks for an API token (answered without one)")
    async def access() -> dict[str, bool]:
        return {"tokenRequired": bool(token)}

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    @app.get("/metrics", summary="Prometheus metrics", response_class=PlainTextResponse)
    async def metrics_endpoint(request: Request) -> PlainTextResponse:
        if token and not token_matches(bearer_token(request.headers), token):
            raise ApiError(401, "missing or wrong API token (send Authorization: Bearer <token>)")
        text: str = await run(metrics.render)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers=_PAGE_HEADERS)

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    # -- error handlers ------------------------------------------------------------------------------------
    @app.exception_handler(ApiError)
    async def on_api_error(_: Request, exc: ApiError) -> JSONResponse:
        return _error(exc.status, exc.message, headers=exc.headers, **exc.extra)

    @app.exception_handler(QueueError)
    async def on_queue_error(_: Request, exc: QueueError) -> JSONResponse:
        for kind, status in _QUEUE_STATUS:
            if isinstance(exc, kind):
                return _error(status, str(exc))
        return _error(409, str(exc))

    @app.exception_handler(RequestValidationError)
    async def on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        status, message, details = _describe_validation(exc)
        return _error(status, message, details=details) if details else _error(status, message)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and message == "Not Found":
            message = "no such endpoint"
        return JSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    def storage_refusal(request: Request, exc: Exception) -> JSONResponse | None:
        problem = storage_problem(exc, db.url)
        if problem is None:
            return None
        # Expected trouble, not a bug: one line for the operator (naming the file), no traceback.
        log.warning(
            "%s %s refused for now: %s (%s)",
            request.method,
            request.url.path,
            problem.describe(),
            problem.detail,
        )
        return _error(
            503,
            problem.public(),
            headers={"Retry-After": str(problem.retry_after)},
            retryAfter=problem.retry_after,
        )

    # Registered per driver error class (not only as the catch-all below): Starlette re-raises what reaches
    # the catch-all after answering, which would print a traceback for every refused request.
    async def on_driver_error(request: Request, exc: Exception) -> JSONResponse:
        refusal = storage_refusal(request, exc)
        if refusal is None:
            raise exc  # not storage trouble: the catch-all answers 500 and logs it as a bug
        return refusal

    for driver_error in (sqlite3.Error, psycopg.Error, SQLAlchemyError, OSError):
        app.add_exception_handler(driver_error, on_driver_error)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        refusal = storage_refusal(request, exc)
        if refusal is not None:
            return refusal
        log.exception("unexpected error")
        return _error(500, f"internal error ({type(exc).__name__}); see the server log")

    # Added last, so they run first: a body is refused for size before any token, JSON or database work, and
    # a foreign page is refused before anything else (its refusal and every CORS answer wrap all the rest).
    app.add_middleware(
        BodyLimit,
        limit=max_body_bytes if max_body_bytes is not None else settings.api.max_body_bytes,
        timeout=settings.api.body_timeout_seconds,
    )
    app.add_middleware(OriginGuard, allowed=settings.api.allowed_origins)
    return app


_PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}
