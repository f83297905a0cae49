"""Backups of the live database and restoring them (shared/storage/backup.py, shared/storage/restore.py), on a
real SQLite file and on the real PostgreSQL server: a copy taken while messages flow holds every message
committed before it began and passes its integrity check; newer copies are refused, older ones upgraded; a
full disk leaves no half file."""

from __future__ import annotations

import secrets
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue.core import Queue
from shared.storage.backup import BackupError, Progress, database_counts, take_backup
from shared.storage.db import SCHEMA_VERSION, Database
from shared.storage.restore import check_fits, inspect_copy, restore_copy
from shared.storage.schema import open_database
from tests.fault_support import mounted_tmpfs
from tests.probes import wait_for
from tests.scheduler_support import fresh_pg_database

pytestmark = pytest.mark.integration


@pytest.fixture
def other_url(db_url: str, tmp_path: Path) -> Iterator[str]:
    """An empty second database of the same kind as ``db_url``: where a copy is restored."""
    if db_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'restored' / 'agentpost.db'}"
        return
    with fresh_pg_database() as url:
        yield url


def _suffix(db: Database) -> str:
    return "db" if db.dialect.is_sqlite else "dump"


def _message_ids(db: Database) -> set[str]:
    return {str(r["message_id"]) for r in db.read("SELECT message_id FROM messages")}


class Enqueuer:
    """Enqueues messages through the real queue in a thread, remembering each id once its commit returned."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.committed: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                result = self.queue.intake.enqueue_message(ChatAddress("web", f"chat{n % 7}", "ann"), f"m{n}")
                with self.lock:
                    self.committed.append(result.message_id)
        except BaseException as exc:
            self.error = exc

    def count(self) -> int:
        with self.lock:
            return len(self.committed)

    def snapshot(self) -> set[str]:
        with self.lock:
            return set(self.committed)


def test_a_backup_taken_while_messages_flow_holds_every_message_committed_before_it(
    queue: Queue, tmp_path: Path, other_url: str
) -> None:
    db = queue.db
    flow = Enqueuer(queue)
    flow.thread.start()
    try:
        wait_for(lambda: flow.count() >= 50, 30, "50 messages enqueued before the backup")
        before = flow.snapshot()
        during: list[int] = []

        def report(p: Progress) -> None:
            # At the copy's first report, 100 more messages must get through: the backup holds no writer off.
            if not during:
                start = flow.count()
                wait_for(
                    lambda: flow.count() >= start + 100, 60, "100 messages enqueued while the backup runs"
                )
                during.append(flow.count() - start)

        result = take_backup(db, tmp_path / f"copy.{_suffix(db)}", progress=report, step_pages=1)
        after_backup = flow.count()
    finally:
        flow.stop.set()
        flow.thread.join(30)
    assert flow.error is None, flow.error
    assert during and during[0] >= 100
    assert after_backup >= len(before) + 100
    assert not list(tmp_path.glob(".copy.*partial*"))
    assert result.path.stat().st_mode & 0o777 == 0o600

    info = inspect_copy(result.path)
    assert info.schema_version == SCHEMA_VERSION and not info.newer
    target = Database(other_url)
    try:
        restore_copy(info, target)
        restored = _message_ids(target)
        missing = before - restored
        assert not missing, f"{len(missing)} messages committed before the backup are not in it"
        # The counts printed are the copy's own: exactly what was restored.
        assert sum(result.counts.messages.values()) == len(restored)
        assert database_counts(target) == result.counts
        # The restored database takes new work.
        Queue(target, queue.config, queue.directory).intake.enqueue_message(
            ChatAddress("web", "x", "ann"), "new"
        )
        assert len(_message_ids(target)) == len(restored) + 1
    finally:
        target.close()
    if info.kind == "sqlite":
        conn = sqlite3.connect(result.path)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)  # one self-contained file
        finally:
            conn.close()


def _record_version(db: Database, version: int) -> None:
    with db.transaction() as tx:
        tx.execute("DELETE FROM schema_version")
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (:v, :t)", {"v": version, "t": now_ms()}
        )


def test_a_copy_from_a_newer_agentpost_is_refused_and_an_older_one_upgraded(
    db: Database, tmp_path: Path, other_url: str
) -> None:
    _record_version(db, SCHEMA_VERSION + 1)
    newer = take_backup(db, tmp_path / f"newer.{_suffix(db)}")
    info = inspect_copy(newer.path)
    assert info.newer and info.schema_version == SCHEMA_VERSION + 1
    target = Database(other_url)
    try:
        with pytest.raises(BackupError, match="newer agentpost"):
            check_fits(info, target)
        with pytest.raises(BackupError, match="newer agentpost"):
            restore_copy(info, target)
        assert database_counts(target) is None  # nothing was written

        _record_version(db, SCHEMA_VERSION - 1)
        older = inspect_copy(take_backup(db, tmp_path / f"older.{_suffix(db)}").path)
        assert older.older
        assert restore_copy(older, target) == SCHEMA_VERSION - 1
        assert int(target.read_scalar("SELECT MAX(version) FROM schema_version")) == SCHEMA_VERSION
    finally:
        target.close()
        _record_version(db, SCHEMA_VERSION)


def test_a_damaged_or_foreign_file_is_refused_before_anything_changes(
    tmp_path: Path, sqlite_url: str
) -> None:
    db = open_database(sqlite_url)
    try:
        good = take_backup(db, tmp_path / "good.db")
    finally:
        db.close()
    damaged = tmp_path / "damaged.db"
    data = bytearray(good.path.read_bytes())
    data[4096 * 2 : 4096 * 4] = b"\xff" * (4096 * 2)  # two pages of tables overwritten
    damaged.write_bytes(bytes(data))
    with pytest.raises(BackupError, match="damaged"):
        inspect_copy(damaged)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(BackupError, match="neither a SQLite database nor a pg_dump"):
        inspect_copy(text)
    with pytest.raises(BackupError, match="no file"):
        inspect_copy(tmp_path / "absent.db")
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(BackupError, match="not agentpost's"):
        inspect_copy(foreign)


@pytest.mark.postgres
def test_a_truncated_pg_dump_is_refused(pg_url: str, tmp_path: Path) -> None:
    db = open_database(pg_url)
    try:
        dump = take_backup(db, tmp_path / "copy.dump").path
    finally:
        db.close()
    cut = tmp_path / "cut.dump"
    cut.write_bytes(dump.read_bytes()[:200])
    with pytest.raises(BackupError, match="damaged or not a complete pg_dump"):
        inspect_copy(cut)


def test_the_destination_is_refused_with_what_to_do(tmp_path: Path, sqlite_url: str) -> None:
    db = open_database(sqlite_url)
    try:
        first = take_backup(db, tmp_path / "copy.db")
        with pytest.raises(BackupError, match=r"exists already.*--force"):
            take_backup(db, first.path)
        assert take_backup(db, first.path, force=True).path == first.path
        with pytest.raises(BackupError, match=r"does not exist; create it first \(mkdir -p"):
            take_backup(db, tmp_path / "missing" / "copy.db")
        with pytest.raises(BackupError, match="is a folder"):
            take_backup(db, tmp_path)
    finally:
        db.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for this test (root only; skipped elsewhere)."""
    with mounted_tmpfs(tmp_path / "disk", "1m") as mount:
        yield mount


def test_a_full_disk_is_said_plainly_and_leaves_no_half_file(queue: Queue, small_disk: Path) -> None:
    for n in range(120):
        # Random text: pg_dump compresses, and 2 MB of it must not fit into 1 MiB either way.
        queue.intake.enqueue_message(ChatAddress("web", "c", "ann"), secrets.token_hex(8_000) + str(n))
    with pytest.raises(BackupError, match=r"is full \(.* free\): no backup was written"):
        take_backup(queue.db, small_disk / f"copy.{_suffix(queue.db)}")
    assert list(small_disk.iterdir()) == []


@pytest.mark.postgres
def test_without_the_postgresql_client_programs_the_error_names_their_package(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = open_database(pg_url)
    try:
        dump = take_backup(db, tmp_path / "copy.dump").path
        monkeypatch.setenv("PATH", str(tmp_path / "no-tools-here"))
        with pytest.raises(BackupError, match=r"pg_dump is not on PATH: .*apt install postgresql-client"):
            take_backup(db, tmp_path / "again.dump")
        with pytest.raises(BackupError, match=r"pg_restore is not on PATH: .*postgresql-client"):
            inspect_copy(dump)
    finally:
        db.close()
    assert not (tmp_path / "again.dump").exists()
