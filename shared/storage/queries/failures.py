"""Failure and recovery of claimed messages (:mod:`shared.queue.failures`): a failed group retried or
buried, and the claims and agent leases of workers that died taken back."""

from __future__ import annotations

from shared.storage.queries.common import PENDING, PROCESSING
from shared.storage.statuses import MessageStatus

#: Back to pending after a failed attempt (``:n`` attempts so far), due at ``:at``.
RETRY_LATER = (
    f"UPDATE messages SET status = {PENDING}, retry_count = :n, last_error = :err, updated_at = :now, "
    "available_at = :at, lease_until = NULL, claimed_by = NULL, run_started_at = NULL WHERE id = :id"
)
#: A dead letter, with its attempts and interrupted runs.
BURY = (
    f"UPDATE messages SET status = '{MessageStatus.DEAD}', retry_count = :n, interruptions = :i, last_error = :err, "
    "updated_at = :now, lease_until = NULL, run_started_at = NULL WHERE id = :id"
)
CLAIMS = f"SELECT message_id, claimed_by, lease_until FROM messages WHERE status = {PROCESSING}"
LEASE_HOLDERS = "SELECT agent, holder, lease_until FROM agent_leases WHERE holder IS NOT NULL"
#: Frees the agent lease ``:h`` holds whose ``lease_until`` was read as NULL.
FREE_LEASE = "UPDATE agent_leases SET holder = NULL, lease_until = 0 WHERE agent = :a AND holder = :h"
#: Frees the agent lease ``:h`` holds, only as it was judged (``:seen``): a holder that renewed it since
#: keeps it.
FREE_LEASE_AS_SEEN = (
    "UPDATE agent_leases SET holder = NULL, lease_until = 0 WHERE agent = :a AND holder = :h "
    "AND lease_until = :seen"
)
#: The messages ``:worker`` holds, oldest first.
CLAIMS_OF = (
    f"SELECT message_id, agent FROM messages WHERE status = {PROCESSING} AND claimed_by = :worker ORDER BY id"
)


def _marks(count: int) -> str:
    return "(" + ", ".join(f":m{i}" for i in range(count)) + ")"


def claims_of_locked(count: int) -> str:
    """The claims ``:worker`` holds among ``count`` message ids (``:m0``, ``:m1``, …), by row id, locked
    (PostgreSQL) until the transaction ends."""
    return (
        f"SELECT * FROM messages WHERE status = {PROCESSING} AND claimed_by = :worker "
        f"AND message_id IN {_marks(count)} ORDER BY id{{lock_rows}}"
    )


def claims_locked(count: int) -> str:
    """The claims among ``count`` message ids (``:m0``, ``:m1``, …), whoever holds them, by row id, locked
    (PostgreSQL) until the transaction ends."""
    return (
        f"SELECT * FROM messages WHERE status = {PROCESSING} AND message_id IN {_marks(count)} ORDER BY id"
        "{lock_rows}"
    )


#: A claim whose run had not started: back to pending at once, free.
RELEASE = (
    f"UPDATE messages SET status = {PENDING}, claimed_by = NULL, lease_until = NULL, "
    "available_at = :now, updated_at = :now WHERE id = :id"
)
#: A claim whose run had started: back to pending at once, with ``:i`` interrupted runs.
INTERRUPTED = (
    f"UPDATE messages SET status = {PENDING}, interruptions = :i, last_error = :err, "
    "claimed_by = NULL, lease_until = NULL, run_started_at = NULL, available_at = :now, "
    "updated_at = :now WHERE id = :id"
)
