"""The scheduler's backup job (scheduler/backups.py) and doctor's word on backups, on a SQLite file and on
PostgreSQL: a copy when one is due, the newest ``keep`` kept, the result recorded; a warning when the newest
backup is older than two periods."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import backups
from scheduler.backup_commands import doctor_checks
from scheduler.service import SchedulerService
from shared.clock import now_ms
from shared.runtime import Runtime
from shared.storage.backup_record import BackupRecord, last_backup, last_good_backup, record_backup
from shared.storage.restore import inspect_copy
from tests.scheduler_support import open_scheduler_runtime

pytestmark = pytest.mark.integration

HOUR = 3_600_000


@pytest.fixture
def backup_rt(tmp_path: Path, db_url: str) -> Iterator[Runtime]:
    runtime = open_scheduler_runtime(tmp_path, db_url, '[backup]\nevery = "1h"\nkeep = 2\n')
    # A new database, whatever the session's PostgreSQL database went through before (its age counts).
    with runtime.db.transaction() as tx:
        tx.execute("UPDATE schema_version SET applied_at = :now", {"now": now_ms()})
    yield runtime
    runtime.close()


def test_the_scheduled_job_takes_a_copy_when_due_and_keeps_the_newest_keep(backup_rt: Runtime) -> None:
    rt = backup_rt
    folder = rt.settings.home / "backups"
    service = SchedulerService(rt)
    assert service.backup().result is None  # a new database: its first copy is due after one period
    assert not folder.exists()
    start = now_ms()
    taken = []
    for n in range(1, 5):
        done = backups.backup_if_due(rt.db, rt.settings, now=start + n * (HOUR + 5000))
        assert done.result is not None and not done.error
        taken.append(done.result.path)
        # Not due again a minute later: the copy just taken is recorded.
        assert (
            backups.backup_if_due(rt.db, rt.settings, now=start + n * (HOUR + 5000) + 60_000).result is None
        )
    (folder / "notes.txt").write_text("the operator's own file")
    backups.prune_copies(folder, 2)
    kept = sorted(p.name for p in folder.iterdir())
    assert kept == sorted([taken[-2].name, taken[-1].name, "notes.txt"])
    assert inspect_copy(taken[-1]).schema_version > 0
    last = last_backup(rt.db)
    assert last is not None and last.ok and last.scheduled and last.file == str(taken[-1]) and last.size > 0


def test_a_failed_scheduled_backup_is_recorded_and_tried_again_sooner(
    backup_rt: Runtime, tmp_path: Path
) -> None:
    rt = backup_rt
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    (rt.settings.home / "settings.toml").write_text(
        (rt.settings.home / "settings.toml")
        .read_text()
        .replace("keep = 2", f'keep = 2\ndir = "{blocker}/sub"')
    )
    rt.refresh_settings(force=True)
    failed = backups.backup_if_due(rt.db, rt.settings, force=True)
    assert failed.result is None and failed.error
    last = last_backup(rt.db)
    assert last is not None and not last.ok and last.error and last_good_backup(rt.db) is None
    level, detail, fix = backups.staleness(rt.db, rt.settings)
    assert level == "warn" and "latest backup failed" in detail and "agentpost backup FILE" in fix
    # Retried after 15 minutes at most (the period is an hour), not at every look of the job.
    assert not backups.is_due(rt.db, 3600, last.at + 60_000)
    assert backups.is_due(rt.db, 3600, last.at + 15 * 60_000)


def test_doctor_warns_when_the_newest_backup_is_older_than_two_periods(backup_rt: Runtime) -> None:
    rt = backup_rt
    now = now_ms()
    [young] = doctor_checks(rt.settings)
    assert young.level == "ok" and "no backup yet" in young.detail  # a database younger than two periods
    with rt.db.transaction() as tx:
        tx.execute("UPDATE schema_version SET applied_at = :t", {"t": now - 3 * HOUR})
    [never] = doctor_checks(rt.settings)
    assert never.level == "warn" and "no backup has been taken" in never.detail
    assert "agentpost backup FILE" in never.fix and "every 1h" in never.fix
    record_backup(rt.db, BackupRecord(at=now - 3 * HOUR, ok=True, file="/b/agentpost-old.db", size=2048))
    [stale] = doctor_checks(rt.settings)
    assert stale.level == "warn" and "older than two backup periods" in stale.detail
    assert "3 h ago" in stale.detail and "/b/agentpost-old.db" in stale.detail
    assert "agentpost backup FILE" in stale.fix
    record_backup(rt.db, BackupRecord(at=now - HOUR, ok=True, file="/b/agentpost-new.db", size=2048))
    [fresh] = doctor_checks(rt.settings)
    assert fresh.level == "ok" and "60 min ago" in fresh.detail and "agentpost-new.db" in fresh.detail
