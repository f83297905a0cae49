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
from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope, scoped

#: Messages kept per waiting sender; later ones are answered with a reminder only.
MAX_HELD = 5


def hold(db: Database, channel: str, sender_id: str, item: dict[str, Any], *, cap: int = MAX_HELD) -> bool:
    """Keep one message of an unpaired sender; False when the sender already has ``cap`` kept."""
    scope = scoped(Scope.HELD, channel)
    with db.transaction() as tx:
        raw = kv.get(tx, scope, sender_id)
        items: list[dict[str, Any]] = json.loads(raw) if raw else []
        if len(items) >= cap or any(i.get("external_id") == item.get("external_id") for i in items):
            return False
        items.append(item)
        kv.put(tx, scope, sender_id, json.dumps(items))
    return True


def approved_with_held(db: Database, channel: str) -> dict[str, list[dict[str, Any]]]:
    """Senders of ``channel`` approved since they wrote, with the messages kept for them (oldest first)."""
    entries = kv.approved_sender_entries(db, scoped(Scope.HELD, channel), channel)
    return {e.key: json.loads(e.value) for e in entries}


def release(db: Database, channel: str, sender_id: str) -> None:
    """Forget the messages kept for a sender (after they were handled)."""
    with db.transaction() as tx:
        kv.delete(tx, scoped(Scope.HELD, channel), sender_id)


def prune_held(db: Database, channel: str, older_than: int) -> int:
    """Forget kept messages of senders nobody approved (their codes expired long ago)."""
    with db.transaction() as tx:
        return kv.delete_older(tx, scoped(Scope.HELD, channel), older_than)


def remind_due(db: Database, channel: str, sender_id: str, *, every_ms: int = 600_000) -> bool:
    """Whether a waiting sender is due a reminder (at most one per ``every_ms``); records it when due."""
    now = now_ms()
    scope = scoped(Scope.PAIRING_REMINDED, channel)
    with db.transaction() as tx:
        last = kv.get(tx, scope, sender_id)
        if last is not None and now - int(last) < every_ms:
            return False
        kv.put(tx, scope, sender_id, str(now), now)
    return True
