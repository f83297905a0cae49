"""The figures ``/metrics`` reports for the whole system, read from the database at scrape time.

The processors and the channel adapters have no HTTP port of their own: what they do is in the database
(messages, replies, run end events, usage rows, their presence and health rows), so the web process reads it
there and one scrape sees every process. Nothing is counted in the reading process, so every web process
reports the same figures, from whenever it started.

The cost of a read stays flat as history grows: each statement goes through an index (or the event log's
primary key) to rows that are open now or changed within the window (:data:`WINDOW_MS`), never the whole
history (:mod:`shared.storage.queries.metrics`).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.chat import health
from shared.clock import now_ms
from shared.events.log import last_id_before
from shared.queue import presence
from shared.reads.usage import UsageRow, usage_rows
from shared.storage.db import Database, Row, Tx
from shared.storage.dialect import sqlite_path
from shared.storage.queries import metrics as q

#: The window of the "recent" figures: runs, durations, waits, deliveries (one hour).
WINDOW_MS = 3_600_000
#: The windows cost and tokens are summed over, by the label they are reported with.
USAGE_WINDOWS_MS: dict[str, int] = {"1h": 3_600_000, "24h": 86_400_000}

#: Upper bounds (seconds) of the run duration and time-to-first-text histograms.
RUN_BOUNDS: tuple[float, ...] = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
#: Upper bounds (seconds) of the queue wait histogram.
WAIT_BOUNDS: tuple[float, ...] = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


@dataclass
class Buckets:
    """Observations of one histogram: how many fell at or below each of ``bounds`` (not cumulative, the last
    place counts those above every bound), their sum and their number."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        """Count one observation of ``value`` (seconds)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, float]]:
        """The buckets as Prometheus writes them: ``(le, observations at or below it)``, ``+Inf`` last."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((_le(bound), float(running)))
        out.append(("+Inf", float(self.count)))
        return out


def _le(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


@dataclass(frozen=True)
class Liveness:
    """One process's heartbeat: its kind (``processor``, ``scheduler``, ``channel``), its name (a worker id, a
    channel's name), the age of its last heartbeat and whether it runs as far as this host can tell."""

    kind: str
    name: str
    age_seconds: float
    up: bool


@dataclass
class SystemFigures:
    """One reading of the whole system (see the module docstring). Keys are agents, channels or pairs of
    them with a status or outcome; a figure nobody produced is absent."""

    now: int
    #: (agent, status) → messages held now: pending, processing, dead.
    messages: dict[tuple[str, str], int] = field(default_factory=dict)
    #: agent → messages completed within the window.
    completed: dict[str, int] = field(default_factory=dict)
    #: agent → messages that became dead letters within the window.
    dead_lettered: dict[str, int] = field(default_factory=dict)
    #: agent → seconds the oldest message that could be claimed now has waited since its enqueue.
    oldest_pending_seconds: dict[str, float] = field(default_factory=dict)
    #: agent → waits from enqueue to the start of the answering run, of messages completed within the window.
    queue_wait: dict[str, Buckets] = field(default_factory=dict)
    #: (agent, outcome) → runs that ended within the window.
    runs: dict[tuple[str, str], int] = field(default_factory=dict)
    #: agent → durations of the runs that ended within the window.
    run_duration: dict[str, Buckets] = field(default_factory=dict)
    #: agent → times from run start to the CLI's first text, of the runs that ended within the window.
    first_text: dict[str, Buckets] = field(default_factory=dict)
    #: (channel, status) → undelivered replies now: pending, delivering, failed.
    responses: dict[tuple[str, str], int] = field(default_factory=dict)
    #: channel → replies delivered within the window.
    delivered: dict[str, int] = field(default_factory=dict)
    #: channel → replies the platform refused for good within the window.
    delivery_failures: dict[str, int] = field(default_factory=dict)
    #: window label ("1h", "24h") → usage sums per agent over that window.
    usage: dict[str, list[UsageRow]] = field(default_factory=dict)
    processes: list[Liveness] = field(default_factory=list)
    #: The database's size on disk (SQLite: the file and its write-ahead log); None when it cannot be told.
    database_bytes: int | None = None
    #: How long this reading took (seconds).
    read_seconds: float = 0.0


def run_outcome(payload: dict[str, object]) -> str:
    """What a run came to, from its ``chain_step_done`` payload (:func:`workers.drive.step_done`):
    ``completed``, ``stopped`` (``/stop``), ``interrupted`` (a newer message), ``timed_out`` (silent too long
    or past its ceiling) or ``failed``."""
    if payload.get("ok"):
        return "completed"
    stopped_by = payload.get("stopped_by")
    if stopped_by == "stop":
        return "stopped"
    if stopped_by == "interrupt":
        return "interrupted"
    if stopped_by in ("idle", "ceiling") or payload.get("timed_out"):
        return "timed_out"
    return "failed"


def read_figures(db: Database, now: int | None = None) -> SystemFigures:
    """Read every figure in one read transaction (one snapshot on SQLite and PostgreSQL alike)."""
    started = time.perf_counter()
    now = now_ms() if now is None else now
    since = now - WINDOW_MS
    figures = SystemFigures(now=now)
    with db.transaction(write=False) as tx:
        if db.dialect.snapshot_sql is not None:
            tx.execute(db.dialect.snapshot_sql)
        _queue(tx, figures, since)
        _runs(tx, figures, since)
        _deliveries(tx, figures, since)
        if not db.dialect.is_sqlite:
            figures.database_bytes = int(tx.scalar(q.DATABASE_SIZE) or 0)
    figures.usage = {label: usage_rows(db, "agent", now - span) for label, span in USAGE_WINDOWS_MS.items()}
    figures.processes = _liveness(db, now)
    if db.dialect.is_sqlite:
        figures.database_bytes = sqlite_bytes(sqlite_path(db.url))
    figures.read_seconds = time.perf_counter() - started
    return figures


def _queue(tx: Tx, figures: SystemFigures, since: int) -> None:
    for sql, status in ((q.PENDING_BY_AGENT, "pending"), (q.PROCESSING_BY_AGENT, "processing")):
        for row in tx.rows(sql):
            figures.messages[(str(row["agent"]), status)] = int(row["n"])
    for row in tx.rows(q.DEAD_BY_AGENT, {"since": since}):
        figures.messages[(str(row["agent"]), "dead")] = int(row["n"])
        figures.dead_lettered[str(row["agent"])] = int(row["recent"] or 0)
    for row in tx.rows(q.OLDEST_PENDING_BY_AGENT, {"now": figures.now}):
        figures.oldest_pending_seconds[str(row["agent"])] = max(0, figures.now - int(row["oldest"])) / 1000
    bounds = {f"b{i}": int(b * 1000) for i, b in enumerate(WAIT_BOUNDS)}
    for row in tx.rows(q.completed_since(len(WAIT_BOUNDS)), {"since": since, **bounds}):
        agent = str(row["agent"])
        figures.completed[agent] = int(row["n"])
        figures.queue_wait[agent] = _from_sql_buckets(row, WAIT_BOUNDS)


def _from_sql_buckets(row: Row, bounds: Sequence[float]) -> Buckets:
    """A histogram from the cumulative ``le0``, ``le1``, … counts, ``waited`` and ``wait_sum`` (ms) of a row."""
    counts, below = [], 0
    for i in range(len(bounds)):
        at_most = int(row[f"le{i}"] or 0)
        counts.append(at_most - below)
        below = at_most
    waited = int(row["waited"] or 0)
    counts.append(waited - below)
    total = max(0.0, float(row["wait_sum"] or 0) / 1000)
    return Buckets(tuple(bounds), counts, total, waited)


def _runs(tx: Tx, figures: SystemFigures, since: int) -> None:
    # The window's first event by a binary search over the primary key (no index on the time: see the events
    # table), then only the events after it.
    after = last_id_before(tx, since) or 0
    for row in tx.rows(q.RUN_ENDS_AFTER, {"after": after}):
        try:
            payload = json.loads(str(row["payload"]))
        except ValueError:
            continue
        if not isinstance(payload, dict):
            continue
        agent = str(payload.get("agent") or "")
        key = (agent, run_outcome(payload))
        figures.runs[key] = figures.runs.get(key, 0) + 1
        for field_name, histograms in (
            ("duration_ms", figures.run_duration),
            ("first_text_ms", figures.first_text),
        ):
            ms = payload.get(field_name)
            if isinstance(ms, int | float):
                if agent not in histograms:
                    histograms[agent] = Buckets(RUN_BOUNDS)
                histograms[agent].observe(max(0, ms) / 1000)


def _deliveries(tx: Tx, figures: SystemFigures, since: int) -> None:
    for row in tx.rows(q.OPEN_RESPONSES_BY_CHANNEL):
        figures.responses[(str(row["channel"]), str(row["status"]))] = int(row["n"])
    for row in tx.rows(q.ACKED_SINCE_BY_CHANNEL, {"since": since}):
        figures.delivered[str(row["channel"])] = int(row["n"])
    for row in tx.rows(q.FAILED_SINCE_BY_CHANNEL, {"since": since}):
        figures.delivery_failures[str(row["channel"])] = int(row["n"])


def _liveness(db: Database, now: int) -> list[Liveness]:
    found = [
        Liveness("processor", beat.worker, max(0, now - beat.updated_at) / 1000, beat.alive)
        for beat in presence.beats(db, now)
    ]
    found.extend(
        Liveness("scheduler", beat.worker, max(0, now - beat.updated_at) / 1000, beat.alive)
        for beat in presence.beats(db, now, "scheduler")
    )
    found.extend(
        Liveness("channel", h.channel, max(0, now - h.updated_at) / 1000, h.running(now))
        for h in health.read_all(db)
    )
    return found


def sqlite_bytes(path: str) -> int | None:
    """The size of a SQLite database on disk: its file and its write-ahead log (None: no file)."""
    try:
        size = os.stat(path).st_size
    except OSError:
        return None
    # No write-ahead log right now: checkpointed and removed, or never written.
    with contextlib.suppress(OSError):
        size += os.stat(path + "-wal").st_size
    return size
