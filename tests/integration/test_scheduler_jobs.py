"""Each scheduler job called directly (run-until-idle), on a SQLite file and on PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from scheduler import dlq
from scheduler.audit import run_audit
from scheduler.service import SchedulerService
from shared.clock import now_ms
from shared.queue.core import ResponseDraft
from shared.runtime import Runtime, open_runtime
from shared.settings.model import SettingsError
from tests.scheduler_support import count, make_dead, wait_until, write_home

pytestmark = pytest.mark.integration

T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)


def _open(tmp_path: Path, db_url: str, extra: str = "") -> Runtime:
    return open_runtime(write_home(tmp_path / "home", db_url, extra), env={})


@pytest.fixture
def rt(tmp_path: Path, db_url: str) -> Iterator[Runtime]:
    runtime = _open(
        tmp_path, db_url, "[scheduler]\ndlq_archive_age_hours = 0\nunserved_response_age_seconds = 60\n"
    )
    yield runtime
    runtime.close()


def _events(rt: Runtime, type_: str) -> list[dict[str, object]]:
    return [e.as_dict() for e in rt.events.read(None, None, 10_000) if e.type == type_]


def test_recover_job_returns_messages_of_a_dead_worker(rt: Runtime) -> None:
    q = rt.queue
    mid = q.enqueue_message("cli", "ann", "hello").message_id
    claimed = q.claim_all_pending_messages("assistant", "gone-worker", lease_ms=1)
    assert [m.message_id for m in claimed] == [mid]
    q.mark_run_started([mid], "gone-worker")  # its run had started when the worker died
    wait_until(lambda: now_ms() > (q.get_message(mid).lease_until or 0) + 1, what="the lease to expire")  # type: ignore[union-attr]
    service = SchedulerService(rt)
    # An interrupted run is charged to the message (its own budget), not a retry meant for errors.
    assert service.recover() == {"retried": 1, "dead": 0}
    back = q.get_message(mid)
    assert back is not None and back.status == "pending" and back.interruptions == 1 and back.retry_count == 0
    assert service.recover() == {"retried": 0, "dead": 0}  # idempotent: nothing left to recover


def test_prune_job_deletes_only_old_finished_rows(rt: Runtime) -> None:
    q = rt.queue
    old, fresh = (q.enqueue_message("cli", "ann", t).message_id for t in ("old one", "fresh one"))
    claimed = q.claim_all_pending_messages("assistant", "w")
    for m in claimed:
        q.complete_messages([m.message_id], "w", ResponseDraft(message="done"))
    q.release_agent("assistant", "w")
    for r in q.list_responses(10, pending_only=True):
        q.ack_response(r.id)
    make_dead(q, 1)
    pending = q.enqueue_message("cli", "ann", "still waiting").message_id
    day = 86_400_000
    with rt.db.transaction() as tx:  # age the first message and its reply past 24 h
        tx.execute(
            "UPDATE messages SET updated_at = updated_at - :d WHERE message_id = :m",
            {"d": day + 1000, "m": old},
        )
        tx.execute(
            "UPDATE responses SET acked_at = acked_at - :d WHERE message_id = :m", {"d": day + 1000, "m": old}
        )
        tx.execute("UPDATE messages SET updated_at = updated_at - :d WHERE status = 'dead'", {"d": 3 * day})
    pruned, unserved = SchedulerService(rt).prune()
    assert pruned == {"messages": 1, "responses": 1} and unserved == 0
    assert q.get_message(old) is None
    assert q.get_message(fresh).status == "completed"  # type: ignore[union-attr]
    assert q.get_message(pending).status == "pending"  # type: ignore[union-attr]
    assert count(q, "dead") == 1


def test_replies_on_unserved_channels_are_acked_and_recorded(rt: Runtime) -> None:
    q = rt.queue
    service = SchedulerService(rt, start=T0)
    fired = service.fire_due(T0 + timedelta(seconds=1))
    assert fired == []  # no heartbeats configured
    hb = q.enqueue_message("heartbeat", "System", "check in", agent="assistant").message_id
    tg = q.enqueue_message("telegram", "ann", "hi", agent="assistant").message_id
    claimed = q.claim_all_pending_messages("assistant", "w")
    for m in claimed:
        q.complete_messages([m.message_id], "w", ResponseDraft(message=f"reply to {m.message_id}"))
    assert service.prune()[1] == 0  # younger than unserved_response_age_seconds
    with rt.db.transaction() as tx:
        tx.execute("UPDATE responses SET created_at = created_at - 61000")
    assert service.prune()[1] == 1
    assert service.prune()[1] == 0
    by_message = {r.message_id: r.status for r in q.list_responses(10)}
    assert by_message == {hb: "acked", tg: "pending"}
    recorded = _events(rt, "response_unserved")
    assert len(recorded) == 1 and recorded[0]["message_id"] == hb
    assert recorded[0]["payload"]["reply"] == f"reply to {hb}"  # type: ignore[index]


def test_event_cleanup_job_applies_the_ttl(rt: Runtime) -> None:
    rt.queue.enqueue_message("cli", "ann", "one")
    rt.queue.enqueue_message("cli", "ann", "two")
    before = len(rt.events.read(None, None, 1000))
    with rt.db.transaction() as tx:
        tx.execute(
            "UPDATE events SET created_at = created_at - :age WHERE id = (SELECT MIN(id) FROM events)",
            {"age": int(rt.settings.events.ttl_hours * 3_600_000) + 1000},
        )
    assert SchedulerService(rt).clean_events() == 1
    assert len(rt.events.read(None, None, 1000)) == before - 1


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


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('[heartbeats.assistant]\ninterval = 5\ncron = "* * * * *"\n', "heartbeats"),
        ("[heartbeats.nobody]\ninterval = 5\n", "heartbeats.nobody"),
        ('[heartbeats.assistant]\ncron = "99 * * * *"\n', "heartbeats.assistant.cron"),
        ('[[schedules]]\nagent = "assistant"\nmessage = "x"\n', "schedules.0"),
        ('[[schedules]]\nagent = "ghost"\nmessage = "x"\ncron = "* * * * *"\n', "schedules.0.agent"),
        ("[scheduler]\ncatchup_seconds = 90000\n", "scheduler"),
        ('[scheduler]\ntimezone = "Mars/Olympus"\n', "scheduler.timezone"),
    ],
)
def test_bad_scheduler_settings_name_the_key(tmp_path: Path, extra: str, key: str) -> None:
    home = write_home(tmp_path / "home", f"sqlite:///{tmp_path / 'a.db'}", extra)
    # Refused when the settings are loaded (by every command, not only when the scheduler starts).
    with pytest.raises(SettingsError) as err:
        open_runtime(home, env={})
    assert key in str(err.value)


def test_archive_writes_the_file_before_deleting_and_never_twice(rt: Runtime) -> None:
    q = rt.queue
    ids = make_dead(q, 3)
    directory = dlq.dlq_dir(rt.settings)
    # A crash after the fsync and before the delete: the transaction that selected the rows rolls back.
    with pytest.raises(RuntimeError), rt.db.transaction() as tx:
        dlq._archive_batch(tx, directory, now_ms() + 1, 500, now_ms(), dlq.ArchiveResult())
        raise RuntimeError("killed here")
    files = dlq.archive_files(directory)
    assert len(files) == 1 and len(dlq.read_archive(files[0])[0]) == 3
    assert count(q, "dead") == 3  # still in the database too: nothing lost
    result = SchedulerService(rt).archive()
    assert (result.archived, result.already_in_file) == (0, 3)
    assert count(q, "dead") == 0
    entries, corrupt = dlq.read_archive(files[0])
    assert corrupt == [] and sorted(e.message_id for e in entries) == sorted(ids)
    assert entries[0].data["error"] == "provider exploded" and entries[0].data["attempts"] >= 1
    assert {e["message_id"] for e in _events(rt, "dead_archived")} == set(ids)
    assert SchedulerService(rt).archive().archived == 0


def test_restore_puts_entries_back_once_and_skips_corrupt_lines(rt: Runtime) -> None:
    q = rt.queue
    ids = make_dead(q, 3)
    SchedulerService(rt).archive()
    path = dlq.archive_files(dlq.dlq_dir(rt.settings))[0]
    with open(path, "ab") as f:
        f.write(b'{"v":1,"key":"broken\n')  # a torn line, as a crash mid-write would leave
    result = dlq.restore(rt.db, rt.settings, path, only=ids[1])
    assert result.restored == [ids[1]] and len(result.corrupt) == 1
    assert q.get_message(ids[1]).status == "pending"  # type: ignore[union-attr]
    result = dlq.restore(rt.db, rt.settings, path)
    assert sorted(result.restored) == sorted([ids[0], ids[2]]) and result.already_restored == [ids[1]]
    # Even once the restored messages finished and were pruned, a second restore does nothing.
    with rt.db.transaction() as tx:
        tx.execute("DELETE FROM messages")
    again = dlq.restore(rt.db, rt.settings, path)
    assert again.restored == [] and sorted(again.already_restored) == sorted(ids)
    with pytest.raises(LookupError):
        dlq.restore(rt.db, rt.settings, path, only="cli_zzzzzzzz")
    # A restored message that dies again is archived again: a new death, a new line.
    with rt.db.transaction() as tx:
        tx.execute("DELETE FROM kv WHERE scope = :s", {"s": dlq.RESTORED_SCOPE})
    dlq.restore(rt.db, rt.settings, path, only=ids[0])
    worker = "w2"
    claimed = q.claim_all_pending_messages("assistant", worker)
    q.fail_messages([m.message_id for m in claimed], worker, "again")
    q.release_agent("assistant", worker)
    died = now_ms()
    wait_until(lambda: now_ms() > died + 1, what="the clock to move past the death")
    assert SchedulerService(rt).archive().archived == 1
    entries = [e for p in dlq.archive_files(dlq.dlq_dir(rt.settings)) for e in dlq.read_archive(p)[0]]
    assert sorted(e.message_id for e in entries).count(ids[0]) == 2
    info = dlq.status(rt.db, dlq.dlq_dir(rt.settings), 0)
    assert info["dead_in_database"] == 0 and info["archived_entries"] == 4
    assert sum(f["corrupt"] for f in info["files"]) == 1


def test_audit_measures_the_profile_and_judges_it(rt: Runtime) -> None:
    q = rt.queue
    for i in range(6):
        q.enqueue_message("cli", "ann", f"m{i}")
    claimed = q.claim_all_pending_messages("assistant", "w")
    for m in claimed[:4]:
        q.complete_messages([m.message_id], "w", ResponseDraft(message="ok"))
    q.fail_messages([m.message_id for m in claimed[4:]], "w", "boom")
    audit = run_audit(q, hours=1, capacity_per_second=1000)
    assert (audit.received, audit.completed, audit.dead) == (6, 4, 2)
    assert audit.peak_per_second >= 1 and audit.hours and audit.hours[-1].received == 6
    assert audit.depth["dead"] == 2
    if audit.database == "sqlite":
        assert audit.verdict.startswith("Within capacity") and not audit.move_to_postgresql
        tight = run_audit(q, hours=1, capacity_per_second=0.01)
        assert tight.verdict.startswith("Beyond capacity") and tight.move_to_postgresql
    else:
        assert "already runs on postgresql" in audit.verdict


def test_heartbeat_hygiene_active_hours_and_busy_agents(tmp_path: Path, db_url: str) -> None:
    extra = '[heartbeats.assistant]\ninterval = 3600\nactive_hours = "22:00-06:00"\n'
    home = write_home(tmp_path / "home", db_url, extra)
    with open_runtime(home, env={}) as rt:
        service = SchedulerService(rt, start=T0)
        # 12:00 UTC is outside 22:00-06:00 (a window across midnight): skipped, and the event says why.
        [noon] = service.fire_due(T0 + timedelta(seconds=1))
        assert (
            noon.skipped.startswith("outside active hours") and rt.queue.get_message(noon.message_id) is None
        )
        [night] = service.fire_due(T0 + timedelta(hours=11, seconds=1))  # 23:00
        assert not night.skipped and not night.duplicate
        # The 23:00 heartbeat is still waiting: the next slot is skipped rather than piled up behind it.
        [busy] = service.fire_due(T0 + timedelta(hours=12, seconds=1))
        assert busy.skipped == "the agent is busy"
        reasons = [e["payload"]["reason"] for e in _events(rt, "heartbeat_skipped")]  # type: ignore[index]
        assert reasons == ["outside active hours 22:00-06:00", "the agent is busy"]
        assert rt.db.read_scalar("SELECT COUNT(*) FROM messages WHERE channel = 'heartbeat'") == 1


def test_active_hours_are_validated(tmp_path: Path, db_url: str) -> None:
    home = write_home(
        tmp_path / "home", db_url, '[heartbeats.assistant]\ninterval = 60\nactive_hours = "9-5"\n'
    )
    with pytest.raises(SettingsError, match="active_hours"):
        open_runtime(home, env={})
