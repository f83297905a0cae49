"""Messages from senders waiting for pairing approval, kept so approval answers them without a resend.

A channel keeps the first few messages an unpaired sender writes (scope ``held:<channel>`` in ``kv``, key =
the sender id, value = a JSON list) and, once an operator approves the sender, takes them back in order and
handles them like new ones. The platform message ids stay with them, so a message held and also redelivered by
the platform is still answered once.
"""

from __future__ import annotations

import json
from typing import Any

from shared.clock import now_ms
from shared.db import Database

#: Messages kept per waiting sender; later ones are answered with a reminder only.
MAX_HELD = 5


def _scope(channel: str) -> str:
    return f"held:{channel}"


def hold(db: Database, channel: str, sender_id: str, item: dict[str, Any], *, cap: int = MAX_HELD) -> bool:
    """Keep one message of an unpaired sender; False when the sender already has ``cap`` kept."""
    with db.transaction() as tx:
        raw = tx.scalar(
            "SELECT value FROM kv WHERE scope = :s AND key = :k", {"s": _scope(channel), "k": sender_id}
        )
        items: list[dict[str, Any]] = json.loads(str(raw)) if raw else []
        if len(items) >= cap or any(i.get("external_id") == item.get("external_id") for i in items):
            return False
        items.append(item)
        tx.execute(
            "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) ON CONFLICT (scope, key) "
            "DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            {"s": _scope(channel), "k": sender_id, "v": json.dumps(items), "now": now_ms()},
        )
    return True


def approved_with_held(db: Database, channel: str) -> dict[str, list[dict[str, Any]]]:
    """Senders of ``channel`` approved since they wrote, with the messages kept for them (oldest first)."""
    rows = db.read(
        "SELECT kv.key AS sender_id, kv.value AS value FROM kv JOIN pairings p ON p.channel = :c "
        "AND p.sender_id = kv.key AND p.status = 'approved' WHERE kv.scope = :s",
        {"c": channel, "s": _scope(channel)},
    )
    return {str(r["sender_id"]): json.loads(str(r["value"])) for r in rows}


def release(db: Database, channel: str, sender_id: str) -> None:
    """Forget the messages kept for a sender (after they were handled)."""
    with db.transaction() as tx:
        tx.execute("DELETE FROM kv WHERE scope = :s AND key = :k", {"s": _scope(channel), "k": sender_id})


def prune_held(db: Database, channel: str, older_than: int) -> int:
    """Forget kept messages of senders nobody approved (their codes expired long ago)."""
    with db.transaction() as tx:
        return tx.execute(
            "DELETE FROM kv WHERE scope = :s AND updated_at < :cut", {"s": _scope(channel), "cut": older_than}
        ).rowcount


def remind_due(db: Database, channel: str, sender_id: str, *, every_ms: int = 600_000) -> bool:
    """Whether a waiting sender is due a reminder (at most one per ``every_ms``); records it when due."""
    now = now_ms()
    scope = f"pairing_reminded:{channel}"
    with db.transaction() as tx:
        last = tx.scalar("SELECT value FROM kv WHERE scope = :s AND key = :k", {"s": scope, "k": sender_id})
        if last is not None and now - int(str(last)) < every_ms:
            return False
        tx.execute(
            "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) ON CONFLICT (scope, key) "
            "DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            {"s": scope, "k": sender_id, "v": str(now), "now": now},
        )
    return True
