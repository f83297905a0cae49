"""The HTTP API, live streams and dashboard as one FastAPI application over an open runtime.

Endpoint names and shapes follow seed 000 (request fields in camelCase, rows with their column names). Every
error is a JSON object ``{"error": "..."}`` with a 4xx status, and a failed request changes nothing.

Storage trouble (the database locked by another program, a full disk, a read-only file, PostgreSQL out of
reach) is a temporary refusal, never a 500: ``503`` with ``Retry-After`` and a plain sentence. A request waits
at most ``storage_wait_seconds`` for another process's lock rather than the database's whole busy timeout
(30 s by default), so a held lock costs each caller a moment, not half a minute.

The routes live in routers per area; this module only puts them together over one :class:`WebState`:

- ``queue_routes``: ``/api/message``, ``/api/queue/…``;
- ``response_routes``: ``/api/responses…``;
- ``chatroom_routes``: ``/api/chatroom/{team}``;
- ``event_routes``: ``/api/events…`` (page, ack, SSE stream, WebSocket);
- ``manage``: TinyOffice's management calls (settings, agents, teams, schedules, pairing, status …);
- ``console``: the dashboard's own views and chat actions;
- ``approval_routes``: ``/api/approvals…`` (agents asking before a tool runs, and an operator's answer);
- ``health_routes``: ``/healthz``, ``/access``, ``/metrics`` and the dashboard page.

Every ``/api`` route passes :func:`~adapters.web.auth.require_access` (the WebSocket handshake the same rule,
through :func:`~adapters.web.auth.admit_websocket`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI
from fastapi.staticfiles import StaticFiles

from shared.events.entries import EventLog
from shared.runtime import Runtime
from shared.settings import api_token

from . import (
    approval_routes,
    chatroom_routes,
    console,
    event_routes,
    health_routes,
    manage,
    queue_routes,
    response_routes,
    schedule_routes,
    signin,
    usage_routes,
)
from .auth import require_access
from .errors import install_error_handlers
from .limits import BodyLimit
from .metrics import Metrics
from .origins import OriginGuard
from .state import WebState
from .stream import StreamLimits, StreamStats

#: Default for ``create_app(storage_wait_seconds=...)``: how long a request waits for another process's lock.
DEFAULT_STORAGE_WAIT_SECONDS = 2.0


def create_app(
    runtime: Runtime,
    *,
    events: EventLog | None = None,
    limits: StreamLimits | None = None,
    max_body_bytes: int | None = None,
    storage_wait_seconds: float = DEFAULT_STORAGE_WAIT_SECONDS,
    token: str | None = None,
) -> FastAPI:
    """Build the web adapter over ``runtime``. ``events`` overrides the event log read by streams (the Redis
    driver, say); by default the runtime's SQL log is used. ``storage_wait_seconds`` bounds how long one
    request waits for a lock another process holds before it is answered 503. ``max_body_bytes`` overrides
    ``api.max_body_bytes``. ``token`` is the API token in force; by default :func:`shared.settings.api_token.ensure`
    finds it (writing the home's token file when there is none and open loopback was not asked for)."""
    settings = runtime.settings
    if token is None:
        token = api_token.ensure(settings).value
    event_log: EventLog = events if events is not None else runtime.events
    stats = StreamStats()
    web = WebState(
        runtime=runtime,
        events=event_log,
        limits=limits or StreamLimits(),
        stats=stats,
        metrics=Metrics(runtime.db, lambda: runtime.settings.agents.keys(), stats),
        token=token,
        port=settings.api.port,
        lock_wait_ms=max(0, int(storage_wait_seconds * 1000)),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        runtime.waker  # noqa: B018 - start the change signal before the first stream needs it
        yield

    app = FastAPI(
        title="agentpost",
        version="0.1.0",
        description="Queue, stream and steer AI coding agents.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.web = web
    app.state.runtime = runtime
    app.state.events = event_log
    app.state.stream_stats = stats
    app.state.limits = web.limits

    api = APIRouter(prefix="/api", dependencies=[Depends(require_access)])
    areas = (
        queue_routes,
        response_routes,
        chatroom_routes,
        event_routes,
        manage,
        schedule_routes,
        console,
        usage_routes,
        approval_routes,
    )
    for area in areas:
        api.include_router(area.router)
    app.include_router(api)
    app.include_router(event_routes.websocket_router)
    app.include_router(health_routes.router)
    app.include_router(signin.router)
    app.mount("/static", StaticFiles(directory=health_routes.STATIC_DIR), name="static")
    install_error_handlers(app)

    # Added last, so they run first: a body is refused for size before any token, JSON or database work, and
    # a foreign page is refused before anything else (its refusal and every CORS answer wrap all the rest).
    # The /t/<token> prefix is taken off just before routing, once those have looked at the request.
    app.add_middleware(signin.TokenPrefix, token=token)
    app.add_middleware(
        BodyLimit,
        limit=max_body_bytes if max_body_bytes is not None else settings.api.max_body_bytes,
        timeout=settings.api.body_timeout_seconds,
    )
    served = {
        method
        for router in (*(area.router for area in areas), health_routes.router, signin.router)
        for route in router.routes
        for method in (getattr(route, "methods", None) or ())
    }
    app.add_middleware(OriginGuard, allowed=settings.api.allowed_origins, methods=served)
    return app
