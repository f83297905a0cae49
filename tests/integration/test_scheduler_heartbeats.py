"""Heartbeats (scheduler.heartbeats) fired by the scheduler service, on a SQLite file and on PostgreSQL: once per slot across schedulers, active hours, busy agents."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler.service import SchedulerService
from shared.runtime import open_runtime
from shared.settings.model import SettingsError
from tests.scheduler_support import (
    T0,
    events_of,
    write_home,
)

pytestmark = pytest.mark.integration


def test_heartbeat_fires_once_per_slot_across_two_schedulers(tmp_path: Path, db_url: str) -> None:
    extra = (
        "[heartbeats.assistant]\ninterval = 60\nskip_when_busy = false\n\n"
        '[heartbeats.helper]\ncron = "*/5 * * * *"\nskip_when_busy = false\n'
    )
    agents = '[agents.assistant]\nname = "A"\n\n[agents.helper]\nname = "H"\n'
    home = write_home(tmp_path / "home", db_url, extra, agents=agents)
    (home / "workspace" / "assistant").mkdir(parents=True)
    (home / "workspace" / "assistant" / "heartbeat.md").write_text("Check the build.\n")
    with open_runtime(home, env={}) as one, open_runtime(home, env={}) as two:
        first, second = SchedulerService(one, start=T0), SchedulerService(two, start=T0)
        at = T0 + timedelta(seconds=1)
        a, b = first.fire_due(at), second.fire_due(at)
        # 12:00:00 is a slot of both; each scheduler tried it, the queue kept one message per slot.
        assert sorted((f.job, f.duplicate) for f in a) == [
            ("heartbeat:assistant", False),
            ("heartbeat:helper", False),
        ]
        assert sorted((f.job, f.duplicate) for f in b) == [
            ("heartbeat:assistant", True),
            ("heartbeat:helper", True),
        ]
        assert {f.message_id for f in a} == {f.message_id for f in b}
        assert first.fire_due(at) == []  # that window was looked at already
        # Ten minutes later: the missed assistant slots coalesce into the latest one.
        later = first.fire_due(T0 + timedelta(minutes=10, seconds=2))
        assert sorted((f.job, f.slot.isoformat()) for f in later) == [
            ("heartbeat:assistant", "2030-01-01T12:10:00+00:00"),
            ("heartbeat:helper", "2030-01-01T12:10:00+00:00"),
        ]
        rows = one.db.read("SELECT * FROM messages WHERE channel = 'heartbeat' ORDER BY id")
        assert len(rows) == 4
        assistant = [r for r in rows if r["agent"] == "assistant"]
        assert {r["message"] for r in assistant} == {"Check the build."}
        assert {r["sender"] for r in rows} == {"System"}
        helper = next(r for r in rows if r["agent"] == "helper")
        assert "Heartbeat" in helper["message"]  # no heartbeat.md: the default prompt
        assert json.loads(assistant[0]["metadata"])["slot"] == "2030-01-01T12:00:00+00:00"


def test_heartbeat_hygiene_active_hours_and_busy_agents(tmp_path: Path, db_url: str) -> None:
    extra = '[heartbeats.assistant]\ninterval = 3600\nactive_hours = "22:00-06:00"\n'
    home = write_home(tmp_path / "home", db_url, extra)
    with open_runtime(home, env={}) as rt:
        service = SchedulerService(rt, start=T0)
        # 12:00 UTC is outside 22:00-06:00 (a window across midnight): skipped, and the event says why.
        [noon] = service.fire_due(T0 + timedelta(seconds=1))
        assert (
            noon.skipped.startswith("outside active hours")
            and rt.queue.admin.get_message(noon.message_id) is None
        )
        [night] = service.fire_due(T0 + timedelta(hours=11, seconds=1))  # 23:00
        assert not night.skipped and not night.duplicate
        # The 23:00 heartbeat is still waiting: the next slot is skipped rather than piled up behind it.
        [busy] = service.fire_due(T0 + timedelta(hours=12, seconds=1))
        assert busy.skipped == "the agent is busy"
        reasons = [e["payload"]["reason"] for e in events_of(rt, "heartbeat_skipped")]  # type: ignore[index]
        assert reasons == ["outside active hours 22:00-06:00", "the agent is busy"]
        assert rt.db.read_scalar("SELECT COUNT(*) FROM messages WHERE channel = 'heartbeat'") == 1


def test_active_hours_are_validated(tmp_path: Path, db_url: str) -> None:
    home = write_home(
        tmp_path / "home", db_url, '[heartbeats.assistant]\ninterval = 60\nactive_hours = "9-5"\n'
    )
    with pytest.raises(SettingsError, match="active_hours"):
        open_runtime(home, env={})
