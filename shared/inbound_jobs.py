"""Inbound work a channel accepted from its platform but finishes later — a message whose attachment is still
to be fetched — kept durably so that answering the platform at once (before the slow part) loses nothing:
after a crash the adapter finds the job again and finishes it.

Rows live in ``kv`` (scope ``inbound_jobs:<channel>``, key = the platform's message id, value = the job as
JSON text the channel defines). Saving is idempotent, so a redelivered message does not make a second job.
"""

from __future__ import annotations

from shared.clock import now_ms
from shared.db import Database


def _scope(channel: str) -> str:
    return f"inbound_jobs:{channel}"


def save(db: Database, channel: str, key: str, job: str) -> bool:
    """Store a job unless one with this key exists; returns whether it was new."""
    now = now_ms()
    with db.transaction() as tx:
        n = tx.execute(
            "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) "
            "ON CONFLICT (scope, key) DO NOTHING",
            {"s": _scope(channel), "k": key, "v": job, "now": now},
        ).rowcount
    return bool(n)


def update(db: Database, channel: str, key: str, job: str) -> None:
    """Replace the stored job (e.g. with its attempt count), keeping its place in line."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE kv SET value = :v WHERE scope = :s AND key = :k",
            {"s": _scope(channel), "k": key, "v": job},
        )


def pending(db: Database, channel: str) -> list[tuple[str, str]]:
    """The unfinished jobs of ``channel`` as (key, job), oldest first."""
    rows = db.read(
        "SELECT key, value FROM kv WHERE scope = :s ORDER BY updated_at, key", {"s": _scope(channel)}
    )
    return [(str(r["key"]), str(r["value"])) for r in rows]


def finish(db: Database, channel: str, key: str) -> None:
    """Remove a finished job."""
    with db.transaction() as tx:
        tx.execute("DELETE FROM kv WHERE scope = :s AND key = :k", {"s": _scope(channel), "k": key})
