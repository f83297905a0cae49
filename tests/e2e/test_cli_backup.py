"""`agentpost backup` and `agentpost restore` as a user runs them, on a SQLite home and on PostgreSQL: the copy,
what it holds, restoring into an empty home, the refusals (a home with data without --force, a copy from a
newer agentpost, a processor running) and doctor's word on backups."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue import presence
from shared.runtime import open_runtime
from shared.settings.model import load_settings
from shared.storage.backup_record import BackupRecord, record_backup
from shared.storage.db import SCHEMA_VERSION
from shared.storage.schema import open_database
from shared.worker_identity import new_worker_id
from tests.scheduler_support import fresh_pg_database

pytestmark = pytest.mark.e2e

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), COLUMNS="200", NO_COLOR="1", HOME=str(home))
    return subprocess.run(
        [AGENTPOST, *args], env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL
    )


def ok(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = run(home, *args)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc


def refused(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = run(home, *args)
    assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc


def pending(home: Path) -> int:
    """Messages waiting in the home's database (read directly: each CLI start costs seconds on a busy machine)."""
    db = open_database(load_settings(home, env={}).database_url, create=False)
    try:
        return int(db.read_scalar("SELECT COUNT(*) FROM messages WHERE status = 'pending'") or 0)
    finally:
        db.close()


def make_home(home: Path, url: str | None) -> Path:
    home.mkdir(parents=True)
    if url:
        (home / "settings.toml").write_text(f'[database]\nurl = "{url}"\n')
    return home


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def two_homes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A home to back up and an empty one to restore into, both on SQLite or both on PostgreSQL."""
    if request.param == "sqlite":
        yield make_home(tmp_path / "a", None), make_home(tmp_path / "b", None)
        return
    with fresh_pg_database() as first, fresh_pg_database() as second:
        yield make_home(tmp_path / "a", first), make_home(tmp_path / "b", second)


def test_backup_and_restore_as_a_user_does(two_homes: tuple[Path, Path], tmp_path: Path) -> None:
    source, target = two_homes
    rt = open_runtime(source, env={})  # each CLI start costs seconds on a busy machine: only what is tested
    try:
        for n in range(5):
            rt.queue.intake.enqueue_message(ChatAddress("cli", "you"), f"message {n}")
    finally:
        rt.close()
    copy = tmp_path / "agentpost-copy.bak"
    made = ok(source, "backup", str(copy))
    assert copy.is_file() and copy.stat().st_size > 0
    assert f"backup written: {copy}" in made.stdout and "messages: 5 (pending 5)" in made.stdout
    assert "events: 5" in made.stdout and "agents: 1, chats: 1" in made.stdout
    assert "100%" in made.stderr  # the progress line
    again = refused(source, "backup", str(copy))
    assert "exists already" in again.stderr and "--force" in again.stderr

    restored = ok(target, "restore", str(copy))
    assert "restored" in restored.stdout and "messages: 5 (pending 5)" in restored.stdout
    assert pending(target) == 5

    rt = open_runtime(target, env={})
    try:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "you"), "written after the restore")
    finally:
        rt.close()
    kept = refused(target, "restore", str(copy))
    assert (
        "holds data" in kept.stderr and "messages: 6 (pending 6)" in kept.stderr and "--force" in kept.stderr
    )
    unconfirmed = refused(target, "restore", str(copy), "--force")
    assert "this would be lost" in unconfirmed.stdout and "messages: 6 (pending 6)" in unconfirmed.stdout
    assert "nothing was changed" in unconfirmed.stderr and "--yes" in unconfirmed.stderr
    assert pending(target) == 6
    forced = ok(target, "restore", str(copy), "--force", "--yes")
    assert "messages: 6 (pending 6)" in forced.stdout and "restored" in forced.stdout
    assert pending(target) == 5


def test_restore_refuses_a_newer_copy_and_while_a_processor_runs(tmp_path: Path) -> None:
    source, target = make_home(tmp_path / "a", None), make_home(tmp_path / "b", None)
    ok(source, "send", "hello")
    copy = tmp_path / "copy.db"
    ok(source, "backup", str(copy))

    newer = tmp_path / "newer.db"
    newer.write_bytes(copy.read_bytes())
    with sqlite3.connect(newer) as conn:
        conn.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, 1)", (SCHEMA_VERSION + 1,))
    conn.close()
    said = refused(target, "restore", str(newer))
    assert "newer agentpost" in said.stderr and "upgrade agentpost" in said.stderr
    assert not (target / "agentpost.db").exists() or pending(target) == 0

    db = open_database(f"sqlite:///{target / 'agentpost.db'}")
    worker = new_worker_id()  # this test's own process: alive, as a running processor's would be
    try:
        presence.announce(db, worker, os.getpid(), ["assistant"])
        busy = refused(target, "restore", str(copy))
        assert f"processor {worker}" in busy.stderr and "agentpost down" in busy.stderr
        presence.withdraw(db, worker)
    finally:
        db.close()
    ok(target, "restore", str(copy))
    assert pending(target) == 1


def test_doctor_warns_about_a_stale_backup_and_says_how_to_take_one(tmp_path: Path) -> None:
    home = make_home(tmp_path / "home", None)
    (home / "settings.toml").write_text('[backup]\nevery = "12h"\n')
    ok(home, "send", "hello")
    db = open_database(f"sqlite:///{home / 'agentpost.db'}")
    try:
        record_backup(db, BackupRecord(at=now_ms() - 3 * 86_400_000, ok=True, file="/srv/old.db", size=4096))
    finally:
        db.close()
    found = {(c["area"], c["name"]): c for c in json.loads(run(home, "doctor", "--json").stdout)}
    check = found[("database", "backups")]
    assert check["level"] == "warn" and "3 days ago" in check["detail"] and "/srv/old.db" in check["detail"]
    assert "older than two backup periods (12h each)" in check["detail"]
    assert "agentpost backup FILE" in check["fix"] and "every 12h" in check["fix"]
