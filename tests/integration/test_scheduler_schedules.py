"""User schedules (scheduler.schedules): cron and one-off messages fired by the scheduler service, on a SQLite file and on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from scheduler.service import SchedulerService
from shared.runtime import open_runtime
from tests.scheduler_support import (
    T0,
    write_home,
)

pytestmark = pytest.mark.integration


def test_user_schedules_cron_and_one_off(tmp_path: Path, db_url: str) -> None:
    extra = """
[[schedules]]
name = "standup"
agent = "assistant"
cron = "0 9 * * *"
message = "standup time"

[[schedules]]
agent = "assistant"
at = 2030-01-01T12:00:30
message = "one-off"

[[schedules]]
agent = "assistant"
at = 2029-12-31T00:00:00
message = "long past: outside the catch-up window"

[[schedules]]
name = "off"
agent = "assistant"
cron = "* * * * *"
message = "disabled"
enabled = false
"""
    with open_runtime(write_home(tmp_path / "home", db_url, extra), env={}) as rt:
        service = SchedulerService(rt, start=T0)
        assert service.fire_due(T0) == []
        fired = service.fire_due(T0 + timedelta(minutes=1))
        assert [(f.job.startswith("schedule:auto-"), f.duplicate) for f in fired] == [(True, False)]
        assert service.fire_due(datetime(2030, 1, 2, 8, 59, 59, tzinfo=UTC)) == []
        nine = service.fire_due(datetime(2030, 1, 2, 9, 0, 1, tzinfo=UTC))
        assert [f.job for f in nine] == ["schedule:standup"]
        again = SchedulerService(rt, start=datetime(2030, 1, 2, 9, 0, 1, tzinfo=UTC))
        assert [f.duplicate for f in again.fire_due(datetime(2030, 1, 2, 9, 0, 2, tzinfo=UTC))] == [True]
        texts = sorted(
            r["message"] for r in rt.db.read("SELECT message FROM messages WHERE channel = 'schedule'")
        )
        assert texts == ["one-off", "standup time"]
