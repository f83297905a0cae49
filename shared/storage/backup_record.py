"""When the last backup was taken and how it went: two rows of the ``kv`` table (scope ``backup``), written
by ``agentpost backup`` and the scheduler's backup job, read by ``agentpost doctor`` and the job itself."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope

_LAST = "last"
_LAST_OK = "last_ok"


@dataclass(frozen=True)
class BackupRecord:
    """One backup: when it ended (epoch ms), whether it worked, the file, its size and what went wrong."""

    at: int
    ok: bool
    file: str
    size: int = 0
    seconds: float = 0.0
    error: str = ""
    scheduled: bool = False


def record_backup(db: Database, record: BackupRecord) -> None:
    """Keep ``record`` as the latest backup (and as the latest good one when it worked)."""
    value = json.dumps(asdict(record), separators=(",", ":"))
    with db.transaction() as tx:
        kv.put(tx, Scope.BACKUP, _LAST, value, record.at)
        if record.ok:
            kv.put(tx, Scope.BACKUP, _LAST_OK, value, record.at)


def last_backup(db: Database) -> BackupRecord | None:
    """The latest backup tried, good or not (None: never)."""
    return _read(db, _LAST)


def last_good_backup(db: Database) -> BackupRecord | None:
    """The latest backup that worked (None: never)."""
    return _read(db, _LAST_OK)


def _read(db: Database, key: str) -> BackupRecord | None:
    found = kv.get_record(db, Scope.BACKUP, key)
    if found is None:
        return None
    try:
        return BackupRecord(
            at=int(found["at"]),
            ok=bool(found["ok"]),
            file=str(found.get("file", "")),
            size=int(found.get("size", 0)),
            seconds=float(found.get("seconds", 0.0)),
            error=str(found.get("error", "")),
            scheduled=bool(found.get("scheduled", False)),
        )
    except (KeyError, TypeError, ValueError):
        return None  # written by a release that stored something else: as if none
