"""What this processor remembers about the pauses forced on it: rate limits per agent (how many came in a row,
the backoff grows with them, and until when it paused the agent), and storage outages (writes the database
refused for a while: a full disk, a server restarting).

The rate-limit pause itself is also written to the database (:meth:`shared.queue.control.Control.pause_agent`), where
every processor respects it; the copy here lets the processor's own loop skip the agent without a read.

A storage outage is not written anywhere (nothing can be): :class:`StorageOutage` keeps each write that met
one and makes it again until the database takes it, and remembers when writes were refused, so the
processor can tell the chats whose messages waited long because of it. A full disk rarely refuses every
write (a write that fits in space the log already holds succeeds), so what counts is the time refused in
all, not the longest stretch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio

from shared.aio import call
from shared.clock import now_ms
from shared.reads.conversation_status import format_duration
from shared.storage.db import Tx
from shared.storage.errors import Kind, StorageProblem, transient_problem

log = logging.getLogger("agentpost.processor")

T = TypeVar("T")

#: The longest wait between two tries of a refused write: the write lands at most this long after the
#: database takes writes again.
RETRY_MAX_SECONDS = 0.5
#: How long a processor that is stopping keeps trying a refused write before it leaves it to recovery
#: (a restarted processor takes its claims back at once).
STOPPING_PATIENCE_SECONDS = 3.0

_CAUSES: dict[Kind, str] = {
    "disk_full": "its disk was full",
    "read_only": "its storage could not be written",
    "unreachable": "it could not reach its database",
    "locked": "its database was busy",
    "busy": "its database was overloaded",
    "io_error": "of a disk error",
    "cannot_open": "it could not open its database",
}


class RateLimitPauses:
    """Per-agent rate-limit strikes and pause ends (``time.monotonic`` seconds) of one processor."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        self._strikes: dict[str, int] = {}

    def strike(self, agent: str) -> int:
        """Count one more rate limit of ``agent`` in a row; returns the count (1 for the first)."""
        self._strikes[agent] = self._strikes.get(agent, 0) + 1
        return self._strikes[agent]

    def clear_strikes(self, agent: str) -> None:
        """A run of ``agent`` succeeded: the next rate limit starts the backoff over."""
        self._strikes.pop(agent, None)

    def pause(self, agent: str, seconds: float) -> None:
        """Skip ``agent`` for ``seconds`` from now."""
        self._until[agent] = time.monotonic() + seconds

    def until(self, agent: str) -> float:
        """When the pause of ``agent`` set here ends (monotonic seconds); 0.0 when none was set."""
        return self._until.get(agent, 0.0)


#: How long refusals are remembered (a message waiting longer than this was told already, or never will be).
_REMEMBER_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Outage:
    """A stretch of time in which the database refused this processor's writes."""

    problem: StorageProblem
    started_ms: int
    ended_ms: int


def waited_text(kind: Kind, ms: int) -> str:
    """What a chat whose message waited ``ms`` because of storage trouble of ``kind`` is told."""
    cause = _CAUSES.get(kind, "of a problem with its storage")
    return (
        f"Sorry for the wait: for {format_duration(ms)} the server could not save anything, because "
        f"{cause}. That is fixed now, and your message is being handled."
    )


@dataclass(frozen=True)
class WaitedNote:
    """A note telling a chat why it waited: ``write(tx)`` queues it, ``told()`` records that it went (after
    the transaction committed)."""

    write: Callable[[Tx], None]
    told: Callable[[], None]


class StorageOutage:
    """The writes of one processor that the database refused, kept and made again (see the module
    docstring). ``url`` names the database in the log lines."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.problem: StorageProblem | None = None
        #: The kind of the last refusal (kept after the outage ended, for the notes about it).
        self.last_kind: Kind | None = None
        self.started_ms: int | None = None
        self._ended: list[Outage] = []
        self._spans: list[tuple[int, int]] = []

    @property
    def ongoing(self) -> bool:
        return self.started_ms is not None

    async def keep_trying(self, what: str, write: Callable[[], T], *, stopping: Callable[[], bool]) -> T:
        """``write()`` (on a worker thread) until the database takes it, and its result.

        A refusal that :func:`~shared.storage.errors.transient_problem` recognises is waited out: the same
        write is made again every half second at most, so it lands within a moment of the database
        taking writes again. ``what`` names the write in the log (one line when it is first refused, one
        when it lands). Anything else is raised, as is a refusal once ``stopping()`` has been true for
        :data:`STOPPING_PATIENCE_SECONDS`."""
        delay = 0.05
        refused_at: float | None = None
        while True:
            try:
                result = await call(write)
            except Exception as exc:
                problem = transient_problem(exc, self.url)
                if problem is None:
                    raise
                now = time.monotonic()
                if refused_at is None:
                    refused_at = now
                    log.warning("%s: %s; kept, trying again until it is written", what, problem.describe())
                self._refused(problem)
                if stopping() and now - refused_at >= STOPPING_PATIENCE_SECONDS:
                    raise
                await anyio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_SECONDS)
                continue
            if refused_at is not None:
                log.warning("%s: written after %.1f s", what, time.monotonic() - refused_at)
            self._written()
            return result

    def take_ended(self) -> list[Outage]:
        """The outages that ended since the last call (normally none, or one)."""
        ended, self._ended = self._ended, []
        return ended

    def refused_since(self, since_ms: int) -> int:
        """Milliseconds of outages (the one going on included) after ``since_ms``, in all."""
        spans = [*self._spans, *([(self.started_ms, now_ms())] if self.started_ms is not None else [])]
        return sum(max(0, end - max(start, since_ms)) for start, end in spans)

    def _refused(self, problem: StorageProblem) -> None:
        if self.started_ms is None:
            self.started_ms = now_ms()
        self.problem = problem
        self.last_kind = problem.kind

    def _written(self) -> None:
        if self.started_ms is None or self.problem is None:
            return
        now = now_ms()
        self._ended.append(Outage(self.problem, self.started_ms, now))
        self._spans = [s for s in self._spans if s[1] > now - _REMEMBER_MS] + [(self.started_ms, now)]
        self.started_ms = None
        self.problem = None
