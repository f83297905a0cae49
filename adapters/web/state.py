"""What every route of the web adapter works with, built once per application: :class:`WebState`.

Routes live in routers per area (``*_routes.py``, :mod:`~adapters.web.manage`, :mod:`~adapters.web.console`)
declared at module level; each handler asks for the state with the :data:`Web` dependency instead of closing
over variables of ``create_app``, so a router can be read (and tested) on its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, ParamSpec, TypeVar

from fastapi import Depends
from starlette.requests import HTTPConnection

from shared.aio import call
from shared.events.entries import EventLog
from shared.queue.core import Queue
from shared.runtime import Runtime
from shared.settings.model import Settings
from shared.storage.db import Database, lock_wait_limit

from .metrics import Metrics
from .stream import StreamLimits, StreamStats

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class WebState:
    """The runtime and the stream machinery one application serves, and how long a request waits for a lock."""

    runtime: Runtime
    events: EventLog
    limits: StreamLimits
    stats: StreamStats
    metrics: Metrics
    #: The API token in force when the application was built (:mod:`shared.settings.api_token`; "": none, which
    #: only ``api.allow_open_loopback`` allows, loopback only).
    token: str
    #: ``api.port`` when the application was built (reported by ``GET /api/status``).
    port: int
    #: The most one request waits for a lock another process holds before it is answered 503.
    lock_wait_ms: int

    @property
    def queue(self) -> Queue:
        """The runtime's queue."""
        return self.runtime.queue

    @property
    def db(self) -> Database:
        """The runtime's database."""
        return self.runtime.db

    @property
    def settings(self) -> Settings:
        """The settings in force now (settings.toml is reloaded when it changes)."""
        return self.runtime.settings

    async def run(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` off the event loop (:func:`shared.aio.call`), waiting at most
        :attr:`lock_wait_ms` for another process's lock: a held lock costs a request a moment and a 503,
        not the database's whole busy timeout."""

        def bounded() -> T:
            with lock_wait_limit(self.lock_wait_ms):
                return fn(*args, **kwargs)

        return await call(bounded)


def web_state(conn: HTTPConnection) -> WebState:
    """The dependency behind :data:`Web`: the state of the application serving ``conn``."""
    state: WebState = conn.app.state.web
    return state


#: A handler parameter ``web: Web`` receives the application's :class:`WebState`.
Web = Annotated[WebState, Depends(web_state)]
