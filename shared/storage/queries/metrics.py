"""What one scrape of ``/metrics`` reads (:mod:`shared.reads.metrics`): aggregates over the queue, the outbox
and the event log, each through an index or the primary key, and only over rows that are open now or changed
within the scrape's window (``:since``), so a scrape costs the same however much history the tables hold.

Each condition on ``status`` repeats the condition of the partial index it should use, verbatim (SQLite uses
a partial index only then: see :mod:`shared.storage.models`).
"""

from __future__ import annotations

from functools import lru_cache

from shared.storage.queries.common import PENDING, PROCESSING
from shared.storage.statuses import MessageStatus, ResponseStatus

_COMPLETED = f"'{MessageStatus.COMPLETED}'"
_DEAD = f"'{MessageStatus.DEAD}'"
_ACKED = f"'{ResponseStatus.ACKED}'"
_FAILED = f"'{ResponseStatus.FAILED}'"

#: Pending messages per agent (ix_messages_pending, which leads with the agent: the index alone answers).
PENDING_BY_AGENT = f"SELECT agent, COUNT(*) AS n FROM messages WHERE status = {PENDING} GROUP BY agent"
#: Messages being processed per agent (ix_messages_processing: the rows of running groups only).
PROCESSING_BY_AGENT = f"SELECT agent, COUNT(*) AS n FROM messages WHERE status = {PROCESSING} GROUP BY agent"
#: Dead letters per agent, and how many of them died from ``:since`` on (ix_messages_dead: dead letters
#: only, which the scheduler archives after ``dead_letter_archive_days``).
DEAD_BY_AGENT = (
    "SELECT agent, COUNT(*) AS n, SUM(CASE WHEN updated_at >= :since THEN 1 ELSE 0 END) AS recent "
    f"FROM messages WHERE status = {_DEAD} GROUP BY agent"
)
#: Per agent, the enqueue time of the oldest message available to claim at ``:now`` (ix_messages_pending).
OLDEST_PENDING_BY_AGENT = (
    f"SELECT agent, MIN(created_at) AS oldest FROM messages WHERE status = {PENDING} AND available_at <= :now "
    "GROUP BY agent"
)


@lru_cache(maxsize=8)
def completed_since(bounds: int) -> str:
    """Messages completed from ``:since`` on, per agent (ix_messages_completed, by ``updated_at``): how many,
    and how long they waited from their enqueue to the start of the run that answered them (``run_started_at``;
    the sum in ``wait_sum`` and, for each of ``bounds`` upper bounds ``:b0``, ``:b1``, … in ms, how many waited
    at most that long in ``le0``, ``le1``, …; ``waited``: how many have a start at all)."""
    buckets = "".join(f", SUM(CASE WHEN w <= :b{i} THEN 1 ELSE 0 END) AS le{i}" for i in range(bounds))
    return (
        f"SELECT agent, COUNT(*) AS n, COUNT(w) AS waited, SUM(w) AS wait_sum{buckets} FROM "
        "(SELECT agent, run_started_at - created_at AS w FROM messages "
        f"WHERE status = {_COMPLETED} AND updated_at >= :since) AS done GROUP BY agent"
    )


#: Undelivered replies per channel and status (ix_responses_open: pending, delivering and failed rows only).
OPEN_RESPONSES_BY_CHANNEL = (
    f"SELECT channel, status, COUNT(*) AS n FROM responses WHERE status <> {_ACKED} GROUP BY channel, status"
)
#: Replies delivered and acknowledged from ``:since`` on, per channel (ix_responses_acked, by ``acked_at``).
ACKED_SINCE_BY_CHANNEL = f"SELECT channel, COUNT(*) AS n FROM responses WHERE status = {_ACKED} AND acked_at >= :since GROUP BY channel"
#: Replies the platform refused for good from ``:since`` on, per channel (ix_responses_open).
FAILED_SINCE_BY_CHANNEL = (
    f"SELECT channel, COUNT(*) AS n FROM responses WHERE status <> {_ACKED} AND status = {_FAILED} "
    "AND updated_at >= :since GROUP BY channel"
)
#: The end events of runs after the event id ``:after`` (by the primary key: the events of the window only).
RUN_ENDS_AFTER = "SELECT payload FROM events WHERE id > :after AND type = 'chain_step_done'"
#: PostgreSQL: the size of the database on disk, in bytes.
DATABASE_SIZE = "SELECT pg_database_size(current_database())"
