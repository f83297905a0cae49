"""Durable memory of the platform message ids a channel has already taken in, kept longer than any platform
redelivers (Meta retries a webhook for up to 7 days; Telegram keeps unconfirmed updates for 24 h).

The queue's own duplicate check (``messages.external_id``) lasts only as long as the message row, and
completed rows are pruned after a day; this record has its own retention, independent of that pruning, so
a late redelivery is still recognised. Rows live in ``kv`` (scope ``seen:<channel>``, key = the platform's
id, value = when it was taken in); :func:`prune` removes those past the retention.
"""

from __future__ import annotations

from shared.clock import now_ms
from shared.db import Database

#: How long an id is remembered: longer than the longest platform retry window (7 days).
RETENTION_MS = 8 * 24 * 3600 * 1000
#: The scope commands used before this module existed (still honoured, so an upgrade forgets nothing).
_LEGACY_SCOPE = "handled:{channel}"


def _scope(channel: str) -> str:
    return f"seen:{channel}"


def is_seen(db: Database, channel: str, external_id: str) -> bool:
    """Whether ``external_id`` was already taken in on ``channel`` within the retention (a read only)."""
    if not external_id:
        return False
    value = db.read_scalar(
        "SELECT 1 FROM kv WHERE (scope = :s OR scope = :legacy) AND key = :k LIMIT 1",
        {"s": _scope(channel), "legacy": _LEGACY_SCOPE.format(channel=channel), "k": external_id},
    )
    return value is not None


def remember(db: Database, channel: str, external_id: str) -> None:
    """Record that ``external_id`` was taken in (idempotent: the first time is kept)."""
    if not external_id:
        return
    now = now_ms()
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) "
            "ON CONFLICT (scope, key) DO NOTHING",
            {"s": _scope(channel), "k": external_id, "v": str(now), "now": now},
        )


def prune(db: Database, channel: str, *, retention_ms: int = RETENTION_MS) -> int:
    """Forget the ids of ``channel`` taken in longer ago than ``retention_ms``; returns how many."""
    cut = now_ms() - retention_ms
    with db.transaction() as tx:
        n = tx.execute(
            "DELETE FROM kv WHERE (scope = :s OR scope = :legacy) AND updated_at < :cut",
            {"s": _scope(channel), "legacy": _LEGACY_SCOPE.format(channel=channel), "cut": cut},
        ).rowcount
    return int(n or 0)
