"""Which message shows a run's "still working" note in a chat, kept in the ``kv`` table (scope
``progress.<channel>``, key ``conversation|edit_key``; value = the JSON record ``{"id", "at", "done"}``).

A channel adapter sends a run's progress note once and edits that message with the run's later notes
(:mod:`adapters.progress_notes`); the record here names the platform's message, when it was last sent or
edited, and whether the final reply closed it, so a restarted adapter goes on editing the same message and a
note that arrives after the final reply is dropped. The key is the conversation the adapter sends to (the
response's) and the processor's edit key (its run id). Records older than :data:`NOTE_RECORD_TTL_MS` are
forgotten whenever one is written (a run that never finished leaves one behind).
"""

from __future__ import annotations

import json
from typing import Any

from shared.clock import now_ms
from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope, scoped

#: Progress-note records older than this are removed (a run that never finished leaves one behind).
NOTE_RECORD_TTL_MS = 7 * 24 * 3600 * 1000


def _key(conversation: str, edit_key: str) -> str:
    return f"{conversation}|{edit_key}"


def progress_note(db: Database, channel: str, conversation: str, edit_key: str) -> dict[str, Any] | None:
    """The stored progress note of ``edit_key`` in a chat of ``channel``: ``{"id", "at", "done"}``, or None."""
    return kv.get_record(db, scoped(Scope.PROGRESS, channel), _key(conversation, edit_key))


def keep_progress_note_in(
    tx: Tx, channel: str, conversation: str, edit_key: str, record: dict[str, Any]
) -> None:
    """Store a note's record in the caller's transaction (with the final reply, when it closes the note),
    replacing the earlier one; the channel's records of runs long over are forgotten in the same write."""
    scope, now = scoped(Scope.PROGRESS, channel), now_ms()
    kv.put(tx, scope, _key(conversation, edit_key), json.dumps(record, separators=(",", ":")), now)
    kv.delete_older(tx, scope, now - NOTE_RECORD_TTL_MS)
