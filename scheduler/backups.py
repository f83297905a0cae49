"""The scheduled backup (``[backup]``: ``every``, ``keep``, ``dir``) and what ``agentpost doctor`` says about
backups.

The scheduler looks every :data:`LOOK_SECONDS` (or every ``every``, when shorter) and takes a copy when the
latest one recorded in the database (or, before the first, the database itself) is ``every`` old — so a restarted scheduler neither takes an extra copy
nor skips one, and two schedulers rarely both take one. A failed backup is tried again after
:data:`RETRY_SECONDS` (or ``every``, when shorter). After a good copy only the newest ``keep`` copies of the
folder stay; files this job did not name are never touched.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from shared.clock import now_ms
from shared.settings.backup import format_duration
from shared.settings.model import Settings
from shared.storage.backup import BackupError, BackupResult, database_created_at, human_size, take_backup
from shared.storage.backup_record import BackupRecord, last_backup, last_good_backup, record_backup
from shared.storage.db import Database

log = logging.getLogger("agentpost.scheduler")

#: How often the job looks whether a backup is due.
LOOK_SECONDS = 60.0
#: How soon a failed scheduled backup is tried again.
RETRY_SECONDS = 900.0
#: The names this job gives its copies (and the only files it removes): agentpost-20261206-093000-123.db
SCHEDULED_NAME = re.compile(r"^agentpost-\d{8}-\d{6}-\d{3}\.(db|dump)$")


@dataclass(frozen=True)
class ScheduledBackup:
    """What one look of the job did: the copy taken (None: none was due, or it failed), the files
    removed, and the error when it failed."""

    result: BackupResult | None = None
    removed: tuple[Path, ...] = ()
    error: str = ""


def look_seconds(settings: Settings) -> float:
    """How often the scheduler runs :func:`backup_if_due`."""
    return min(LOOK_SECONDS, settings.file.backup.every)


def is_due(db: Database, every_seconds: float, now: int) -> bool:
    """Whether a scheduled backup should be taken now, going by the latest one recorded."""
    last = last_backup(db)
    if last is None:
        # The first copy of a new database after one period, as every later one.
        created = database_created_at(db)
        return created is None or now - created >= every_seconds * 1000
    wait = every_seconds if last.ok else min(RETRY_SECONDS, every_seconds)
    return now - last.at >= wait * 1000


def backup_if_due(
    db: Database, settings: Settings, *, now: int | None = None, force: bool = False
) -> ScheduledBackup:
    """Take a scheduled copy into the backup folder when one is due (or with ``force``), record it, and keep
    only the newest ``keep`` copies there."""
    config = settings.file.backup
    now = now_ms() if now is None else now
    if not config.enabled or not (force or is_due(db, config.every, now)):
        return ScheduledBackup()
    folder = config.folder(settings.home)
    suffix = "db" if db.dialect.is_sqlite else "dump"
    stamp = datetime.fromtimestamp(now / 1000, tz=UTC)
    name = f"agentpost-{stamp:%Y%m%d-%H%M%S}-{stamp.microsecond // 1000:03d}.{suffix}"
    started = time.monotonic()

    def ended() -> int:  # when the copy ended, on the clock ``now`` was read from
        return now + int((time.monotonic() - started) * 1000)

    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        result = take_backup(db, folder / name)
    except (BackupError, OSError) as exc:
        error = str(exc)
        record_backup(
            db, BackupRecord(at=ended(), ok=False, file=str(folder / name), error=error, scheduled=True)
        )
        log.error("scheduled backup failed: %s", error)
        return ScheduledBackup(error=error)
    record_backup(
        db,
        BackupRecord(
            at=ended(),
            ok=True,
            file=str(result.path),
            size=result.size,
            seconds=result.seconds,
            scheduled=True,
        ),
    )
    removed = prune_copies(folder, config.keep)
    log.info(
        "backup written: %s (%s, %.1f s)%s",
        result.path,
        human_size(result.size),
        result.seconds,
        f"; removed {len(removed)} older cop{'y' if len(removed) == 1 else 'ies'}" if removed else "",
    )
    return ScheduledBackup(result=result, removed=tuple(removed))


def prune_copies(folder: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` scheduled copies in ``folder`` (by the time in their names);
    returns the files removed."""
    copies = sorted(p for p in folder.iterdir() if SCHEDULED_NAME.match(p.name) and p.is_file())
    removed = copies[: max(0, len(copies) - keep)]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def staleness(db: Database, settings: Settings, *, now: int | None = None) -> tuple[str, str, str]:
    """``(level, detail, fix)`` for doctor: ``warn`` when the newest good backup is older than two periods
    (or there is none and the database is older than that), or the latest one failed."""
    config = settings.file.backup
    now = now_ms() if now is None else now
    every = format_duration(config.every)
    how = "take one now with `agentpost backup FILE`"
    if config.enabled:
        how += f"; the scheduler (`agentpost up`) takes one every {every} into {config.folder(settings.home)}"
    else:
        how += " (scheduled backups are off: [backup] enabled = false)"
    good, last = last_good_backup(db), last_backup(db)
    if last is not None and not last.ok:
        when = _ago(now - last.at)
        return "warn", f"the latest backup failed {when}: {last.error}", how
    if good is None:
        created = database_created_at(db)
        if created is not None and now - created <= 2 * config.every * 1000:
            return "ok", f"no backup yet (the database is {_ago(now - created).removesuffix(' ago')} old)", ""
        return "warn", "no backup has been taken of this database", how
    age = now - good.at
    detail = f"latest backup {_ago(age)} ({_at(good.at)}): {good.file}, {human_size(good.size)}"
    if age > 2 * config.every * 1000:
        return "warn", f"{detail} — older than two backup periods ({every} each)", how
    return "ok", detail, ""


def _ago(ms: int) -> str:
    seconds = max(0, ms // 1000)
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    if seconds < 172_800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86_400} days ago"


def _at(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
