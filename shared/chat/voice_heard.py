"""The last voice note heard in each chat, and its words, kept in the ``kv`` table (family ``voice_heard:``
by channel, key = the conversation): ``/status`` shows the chat what was heard, so a person can check the
transcription the agent worked from. Written with the message the words were queued in; a chat's next voice
note overwrites it, and records of other chats older than :data:`KEPT_MS` go when one is written.
"""

from __future__ import annotations

import json

from shared.clock import now_ms
from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope, scoped

#: How long a chat's last transcript is kept (a week).
KEPT_MS = 7 * 24 * 3600 * 1000


def remember_in(tx: Tx, channel: str, conversation: str, words: str, *, at: int | None = None) -> None:
    """Keep ``words`` as the last voice note heard in ``conversation`` (inside the caller's transaction)."""
    now = now_ms() if at is None else at
    scope = scoped(Scope.VOICE_HEARD, channel)
    kv.put(tx, scope, conversation, json.dumps({"words": words, "at": now}), now)
    kv.delete_older(tx, scope, now - KEPT_MS)


def last_heard(db: Database, channel: str, conversation: str) -> tuple[str, int] | None:
    """``(words, when in epoch ms)`` of the last voice note heard in the chat, or None."""
    raw = kv.get(db, scoped(Scope.VOICE_HEARD, channel), conversation)
    if raw is None:
        return None
    try:
        record = json.loads(raw)
        return str(record["words"]), int(record["at"])
    except (ValueError, KeyError, TypeError):
        return None
