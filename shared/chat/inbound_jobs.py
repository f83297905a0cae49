"""Inbound work a channel accepted from its platform but finishes later — a message whose attachment is still
to be fetched — kept durably so that answering the platform at once (before the slow part) loses nothing:
after a crash the adapter finds the job again and finishes it.

Rows live in ``kv`` (scope ``inbound_jobs:<channel>``, key = the platform's message id, value = the job as
JSON text the channel defines). Saving is idempotent, so a redelivered message does not make a second job.
"""

from __future__ import annotations

from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope, scoped


def save(db: Database, channel: str, key: str, job: str) -> bool:
    """Store a job unless one with this key exists; returns whether it was new."""
    with db.transaction() as tx:
        return kv.add(tx, scoped(Scope.INBOUND_JOBS, channel), key, job)


def save_in(tx: Tx, channel: str, key: str, job: str) -> bool:
    """:func:`save` inside the caller's transaction (the job commits with what acknowledges it)."""
    return kv.add(tx, scoped(Scope.INBOUND_JOBS, channel), key, job)


def update(db: Database, channel: str, key: str, job: str) -> None:
    """Replace the stored job (e.g. with its attempt count), keeping its place in line."""
    with db.transaction() as tx:
        kv.replace(tx, scoped(Scope.INBOUND_JOBS, channel), key, job)


def pending(db: Database, channel: str) -> list[tuple[str, str]]:
    """The unfinished jobs of ``channel`` as (key, job), oldest first."""
    return [(e.key, e.value) for e in kv.entries(db, scoped(Scope.INBOUND_JOBS, channel), by_time=True)]


def finish(db: Database, channel: str, key: str) -> None:
    """Remove a finished job."""
    with db.transaction() as tx:
        kv.delete(tx, scoped(Scope.INBOUND_JOBS, channel), key)
