"""The dead-letter archive (seed 004): per-day JSONL files under ``$AGENTPOST_HOME/dlq/``.

Dead letters older than a set age are written to the file of the UTC day they died
(``dlq/YYYY-MM-DD.jsonl``, one JSON object per line: the message, its error, attempts and times), the file
and its folder are fsynced, and only then are exactly those rows deleted, in the same database transaction
that selected them (so nobody retries a row half-way through). A crash after the write and before the
delete leaves the rows in the database *and* in the file; the next run finds their archive keys
(``message_id@died_at``) already in the file and deletes them without writing them again.

Restoring puts an entry back into the queue as ``pending`` with its original message id; the restore is
recorded in the same transaction as the insert (:mod:`shared.queue.dlq_restores`), so an entry is restored
at most once.
A corrupt line is reported and skipped; the rest of the file is still read.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler.config import DlqConfig
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.queue.admin import (
    any_dead_before,
    dead_letter_cut_keeping,
    dead_letter_stats,
    dead_letters_before,
    delete_dead_letters,
    insert_restored_message,
)
from shared.queue.core import Queue
from shared.queue.dlq_restores import record_restore_in, was_restored_in
from shared.settings.model import Settings
from shared.storage.db import Database, Row, Tx

#: Test hook: seconds to wait after the archive files are fsynced and before the rows are deleted, so a
#: crash test can kill the process exactly there. Never set in production.
PAUSE_ENV = "AGENTPOST_DLQ_PAUSE_AFTER_WRITE"
FORMAT_VERSION = 1


def dlq_dir(settings: Settings) -> Path:
    return settings.home / "dlq"


def archive_key(message_id: str, died_at: int) -> str:
    """Identity of one archived death: a message restored and dead again is archived again, once."""
    return f"{message_id}@{died_at}"


def day_of(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class CorruptLine:
    file: str
    line: int
    error: str


@dataclass(frozen=True)
class ArchivedEntry:
    """One line of an archive file."""

    file: str
    line: int
    data: dict[str, Any]

    @property
    def key(self) -> str:
        return str(self.data["key"])

    @property
    def message_id(self) -> str:
        return str(self.data["message"]["message_id"])


def read_archive(path: Path) -> tuple[list[ArchivedEntry], list[CorruptLine]]:
    """Every well-formed entry of one file, and the lines that are not (reported, not fatal)."""
    entries: list[ArchivedEntry] = []
    corrupt: list[CorruptLine] = []
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return entries, corrupt
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            message = data["message"]
            if not isinstance(message, dict) or not isinstance(message.get("message_id"), str):
                raise ValueError("no message.message_id")
            if not isinstance(data.get("key"), str):
                raise ValueError("no key")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            corrupt.append(CorruptLine(path.name, number, str(exc)[:200]))
            continue
        entries.append(ArchivedEntry(path.name, number, data))
    return entries, corrupt


def archive_files(directory: Path) -> list[Path]:
    """The archive files, oldest day first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.glob("*.jsonl") if p.is_file())


def _entry(row: Row, archived_at: int) -> dict[str, Any]:
    message = dict(row)
    message.pop("id", None)
    # Metadata that is not JSON is kept as the text it was: an archive never drops information.
    with contextlib.suppress(ValueError):
        message["metadata"] = json.loads(message.get("metadata") or "{}")
    return {
        "v": FORMAT_VERSION,
        "key": archive_key(str(row["message_id"]), int(row["updated_at"])),
        "message": message,
        "error": row["last_error"],
        "attempts": int(row["retry_count"]),
        "manual_retries": int(row["manual_retries"]),
        "created_at": int(row["created_at"]),
        "died_at": int(row["updated_at"]),
        "archived_at": archived_at,
    }


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _append_lines(path: Path, lines: list[bytes]) -> None:
    with open(path, "ab") as f:
        # A crash mid-write can leave a torn last line; start ours on a fresh line so only that one is bad.
        if f.tell() > 0:
            with open(path, "rb") as r:
                r.seek(-1, os.SEEK_END)
                if r.read(1) != b"\n":
                    f.write(b"\n")
        f.write(b"".join(lines))
        f.flush()
        os.fsync(f.fileno())


@dataclass
class ArchiveResult:
    """What :func:`archive_dead_letters` did."""

    archived: int = 0
    already_in_file: int = 0
    files: list[str] = field(default_factory=list)


def _archive_batch(tx: Tx, directory: Path, cut: int, batch: int, now: int, result: ArchiveResult) -> int:
    rows = dead_letters_before(tx, cut, batch)
    if not rows:
        return 0
    by_day: dict[str, list[Row]] = {}
    for row in rows:
        by_day.setdefault(day_of(int(row["updated_at"])), []).append(row)
    directory.mkdir(parents=True, exist_ok=True)
    for day, day_rows in sorted(by_day.items()):
        path = directory / f"{day}.jsonl"
        existing = {e.key for e in read_archive(path)[0]}
        lines = []
        for row in day_rows:
            entry = _entry(row, now)
            if entry["key"] in existing:
                result.already_in_file += 1
                continue
            lines.append(json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n")
        if lines:
            _append_lines(path, lines)
            result.archived += len(lines)
        if path.name not in result.files:
            result.files.append(path.name)
    _fsync_dir(directory)
    pause = float(os.environ.get(PAUSE_ENV) or 0)
    if pause > 0:
        print(f"dlq: {len(rows)} entries written and fsynced; pausing {pause}s before the delete", flush=True)
        time.sleep(pause)
    delete_dead_letters(tx, [int(r["id"]) for r in rows])
    append_events(
        tx,
        [
            PendingEvent("dead_archived", {"file": f"{day_of(int(r['updated_at']))}.jsonl"}, r["message_id"])
            for r in rows
        ],
        now,
    )
    return len(rows)


def archive_dead_letters(
    db: Database,
    directory: Path,
    *,
    older_than_ms: int,
    batch: int = 500,
    now: int | None = None,
    max_entries: int | None = None,
) -> ArchiveResult:
    """Archive every dead letter that died more than ``older_than_ms`` ago, in batches, until none is left.
    With ``max_entries`` (``[scheduler.dlq]``), the oldest beyond the newest ``max_entries`` are archived too,
    whatever their age (dead letters that died in the same millisecond go together)."""
    now = now_ms() if now is None else now
    cut = now - older_than_ms
    if max_entries is not None:
        boundary = dead_letter_cut_keeping(db, max_entries)
        if boundary is not None:
            cut = max(cut, boundary + 1)
    result = ArchiveResult()
    while True:
        if not any_dead_before(db, cut):
            return result
        with db.transaction() as tx:
            n = _archive_batch(tx, directory, cut, batch, now, result)
        if n < batch:
            return result


# -- restore --------------------------------------------------------------------------------------------------
@dataclass
class RestoreResult:
    """What :func:`restore` did, entry by entry."""

    restored: list[str] = field(default_factory=list)
    already_restored: list[str] = field(default_factory=list)
    in_queue: list[str] = field(default_factory=list)
    corrupt: list[CorruptLine] = field(default_factory=list)
    rerouted: dict[str, str] = field(default_factory=dict)


def _restore_one(tx: Tx, entry: ArchivedEntry, agent: str, now: int) -> str:
    if was_restored_in(tx, entry.key):
        return "already"
    m = entry.data["message"]
    metadata = m.get("metadata", {})
    new_id = insert_restored_message(
        tx,
        {
            "message_id": m["message_id"],
            "channel": m.get("channel") or "cli",
            "sender": m.get("sender") or "",
            "sender_id": m.get("sender_id") or "",
            "message": m.get("message") or "",
            "agent": agent,
            "from_agent": m.get("from_agent"),
            "manual_retries": int(m.get("manual_retries") or 0) + 1,
            "last_error": m.get("last_error"),
            "created_at": int(m.get("created_at") or now),
            "now": now,
            "conversation": m.get("conversation") or "",
            "metadata": metadata
            if isinstance(metadata, str)
            else json.dumps(metadata, separators=(",", ":")),
            "hops": int(m.get("hops") or 0),
            "external_id": m.get("external_id"),
        },
    )
    if new_id is None:
        return "in_queue"
    if not record_restore_in(tx, entry.key, file=entry.file, line=entry.line, row=new_id, now=now):
        # Another restore of this entry committed since the check above: fail as the plain insert did, so
        # this transaction (and its second copy of the message) is rolled back.
        raise RuntimeError(f"archive entry {entry.key} was restored concurrently")
    append_events(
        tx, [PendingEvent("message_restored", {"file": entry.file, "agent": agent}, m["message_id"])], now
    )
    tx.signal("messages")
    return "restored"


def restore(db: Database, settings: Settings, path: Path, *, only: str | None = None) -> RestoreResult:
    """Put the entries of an archive file (or only the one whose message id or key is ``only``) back into
    the queue as ``pending``, each at most once. An entry whose agent no longer exists goes to the default
    agent. Raises FileNotFoundError for a missing file and LookupError when ``only`` matches nothing."""
    if not path.is_file():
        raise FileNotFoundError(f"no archive file {path}")
    entries, corrupt = read_archive(path)
    result = RestoreResult(corrupt=corrupt)
    if only is not None:
        entries = [e for e in entries if only in (e.message_id, e.key)]
        if not entries:
            raise LookupError(f"{path.name} has no entry {only}")
    known = set(settings.agents) | set(settings.teams)
    for entry in entries:
        agent = str(entry.data["message"].get("agent") or "")
        if agent not in known:
            result.rerouted[entry.message_id] = settings.queue.default_agent
            agent = settings.queue.default_agent
        with db.transaction() as tx:
            outcome = _restore_one(tx, entry, agent, now_ms())
        {"restored": result.restored, "already": result.already_restored, "in_queue": result.in_queue}[
            outcome
        ].append(entry.message_id)
    return result


# -- status and listing ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileInfo:
    name: str
    size: int
    entries: int
    corrupt: int


def status(db: Database, directory: Path, older_than_ms: int, *, now: int | None = None) -> dict[str, Any]:
    """Dead letters in the database (total, due for the archive, oldest) and the archive files."""
    now = now_ms() if now is None else now
    stats = dead_letter_stats(db, now - older_than_ms)
    files = []
    for path in archive_files(directory):
        entries, corrupt = read_archive(path)
        files.append(FileInfo(path.name, path.stat().st_size, len(entries), len(corrupt)))
    return {
        "dead_in_database": stats.total,
        "due_for_archive": stats.due,
        "oldest_dead_at": stats.oldest_died_at,
        "archive_dir": str(directory),
        "files": [f.__dict__ for f in files],
        "archived_entries": sum(f.entries for f in files),
        "archive_bytes": sum(f.size for f in files),
    }


def iter_entries(directory: Path, file: str | None = None) -> Iterator[ArchivedEntry | CorruptLine]:
    """Entries (and corrupt lines) of one file or of every file, newest file first."""
    paths = [resolve_file(directory, file)] if file else list(reversed(archive_files(directory)))
    for path in paths:
        entries, corrupt = read_archive(path)
        yield from corrupt
        yield from entries


def resolve_file(directory: Path, name: str) -> Path:
    """An archive file given as a path, a file name in the archive folder, or a day (``2025-01-31``)."""
    candidate = Path(name).expanduser()
    if candidate.is_file():
        return candidate
    for option in (directory / name, directory / f"{name}.jsonl"):
        if option.is_file():
            return option
    raise FileNotFoundError(f"no archive file {name} (looked in {directory})")


def retry_dead_letters(queue: Queue, config: DlqConfig, *, now: int | None = None) -> list[str]:
    """AICP's opt-in automatic retry: dead letters that died ``retry_delay_seconds`` ago go back to
    ``pending``, each at most ``max_retries`` times. Nothing happens unless ``auto_retry`` is on."""
    if not config.auto_retry or config.max_retries <= 0:
        return []
    now = now_ms() if now is None else now
    return queue.admin.retry_dead_automatically(
        died_before_ms=now - int(config.retry_delay_seconds * 1000), budget=config.max_retries
    )
