"""Which entries of the dead-letter archive were put back into the queue, kept in the ``kv`` table (scope
``dlq.restored``, key = the entry's archive key ``message_id@died_at``, value = the JSON of the restore:
``file``, ``line``, ``restored_at``, ``row``).

The scheduler's archive (:mod:`scheduler.dlq`) restores an entry by inserting its message again
(:func:`shared.queue.admin.insert_restored_message`) and recording the restore here in the same transaction
(:func:`record_restore_in`), so an entry is restored at most once, even after the restored message finished
and was pruned. Nothing removes these rows: a restored message that dies again is archived under a new key.
"""

from __future__ import annotations

import json
from typing import Any

from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope


def restored_keys(db: Database) -> dict[str, dict[str, Any]]:
    """Archive keys restored so far, with when and from which file."""
    return {e.key: json.loads(e.value) for e in kv.entries(db, Scope.DLQ_RESTORED)}


def was_restored_in(tx: Tx, key: str) -> bool:
    """Whether the archive entry ``key`` was restored already (read in the restoring transaction)."""
    return kv.get(tx, Scope.DLQ_RESTORED, key) is not None


def record_restore_in(tx: Tx, key: str, *, file: str, line: int, row: int, now: int) -> bool:
    """Record, in the transaction that re-inserted it as ``row``, that the entry ``key`` (line ``line`` of the
    archive file ``file``) was restored at ``now``. False when another restore of it committed first: the
    caller then rolls back its copy of the message."""
    record = json.dumps({"file": file, "line": line, "restored_at": now, "row": row})
    return kv.add(tx, Scope.DLQ_RESTORED, key, record, now)
