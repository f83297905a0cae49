"""Durable memory of the platform message ids a channel has already taken in, kept longer than any platform
redelivers (Meta retries a webhook for up to 7 days; Telegram keeps unconfirmed updates for 24 h).

The queue's own duplicate check (``messages.external_id``) lasts only as long as the message row, and
completed rows are pruned after a day; this record has its own retention, independent of that pruning, so
a late redelivery is still recognised. Rows live in ``kv`` (scope ``seen:<channel>``, key = the platform's
id, value = when it was taken in); :func:`prune` removes those past the retention.
"""

from __future__ import annotations

from shared.clock import now_ms
from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope, scoped

#: How long an id is remembered: longer than the longest platform retry window (7 days).
RETENTION_MS = 8 * 24 * 3600 * 1000


def is_seen(db: Database, channel: str, external_id: str) -> bool:
    """Whether ``external_id`` was already taken in on ``channel`` within the retention (a read only)."""
    if not external_id:
        return False
    # Rows of the scope commands used before this module existed (``handled:<channel>``) are still
    # honoured until :func:`prune` removes them, so an upgrade forgets nothing.
    return any(
        kv.get(db, scoped(family, channel), external_id) is not None
        for family in (Scope.SEEN, Scope.HANDLED_LEGACY)
    )


def remember(db: Database, channel: str, external_id: str) -> None:
    """Record that ``external_id`` was taken in (idempotent: the first time is kept)."""
    if not external_id:
        return
    with db.transaction() as tx:
        remember_in(tx, channel, external_id)


def remember_in(tx: Tx, channel: str, external_id: str) -> None:
    """:func:`remember` inside the caller's transaction (an adapter records it with the message it queues,
    so the update is seen exactly when its message is queued)."""
    if not external_id:
        return
    now = now_ms()
    kv.add(tx, scoped(Scope.SEEN, channel), external_id, str(now), now)


def prune(db: Database, channel: str, *, retention_ms: int = RETENTION_MS) -> int:
    """Forget the ids of ``channel`` taken in longer ago than ``retention_ms``, and the legacy
    ``handled:<channel>`` rows of every channel past it (nothing writes them any more, and a channel that
    was removed would otherwise keep them for ever); returns how many rows went."""
    cut = now_ms() - retention_ms
    with db.transaction() as tx:
        n = kv.delete_older(tx, scoped(Scope.SEEN, channel), cut)
        n += kv.delete_older(tx, Scope.HANDLED_LEGACY, cut, family=True)
    return n
