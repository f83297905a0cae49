"""The scheduler run for real (`agentpost run scheduler` as its own OS process): jobs on their timers,
heartbeat slots fired once by two schedulers, and the archive surviving a SIGKILL between write and delete."""

from __future__ import annotations

import json
import signal
from datetime import datetime
from pathlib import Path

import pytest

from scheduler import dlq
from shared.chat.address import ChatAddress
from shared.reads.metrics import read_figures
from shared.runtime import open_runtime
from shared.storage.backup_record import last_good_backup
from tests.scheduler_support import (
    cli_env,
    count,
    make_dead,
    run_cli,
    start_process,
    stop_process,
    wait_until,
    write_home,
)

pytestmark = pytest.mark.e2e

FAST = """
[scheduler]
recover_interval_seconds = 1
prune_interval_seconds = 1
dlq_archive_interval_seconds = 1
dlq_archive_age_hours = 0
catchup_seconds = 0

[heartbeats.assistant]
interval = 1
skip_when_busy = false  # no processor here: the earlier heartbeats stay pending
"""


def _heartbeats(home: Path) -> list[dict[str, object]]:
    with open_runtime(home, env={}) as rt:
        return rt.db.read(
            "SELECT message_id, metadata, sender FROM messages WHERE channel = 'heartbeat' ORDER BY id"
        )


def test_scheduler_process_runs_its_jobs_and_stops_on_sigterm(tmp_path: Path) -> None:
    home = write_home(tmp_path / "home", f"sqlite:///{tmp_path / 'a.db'}", FAST)
    with open_runtime(home, env={}) as rt:
        dead = make_dead(rt.queue, 2)
        rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "its worker dies")
        rt.queue.messages.claim_all_pending_messages("assistant", "doomed", lease_ms=1)
    log = tmp_path / "scheduler.log"
    proc = start_process(home, "scheduler", log)
    try:
        beats = wait_until(
            lambda: len(_heartbeats(home)) >= 2 and _heartbeats(home), 30, what="two heartbeats"
        )
        assert {b["sender"] for b in beats} == {"System"}
        with open_runtime(home, env={}) as rt:
            wait_until(
                lambda: count(rt.queue, "dead") == 0 and count(rt.queue, "processing") == 0,
                20,
                what="the archive and the lease recovery",
            )
            files = dlq.archive_files(dlq.dlq_dir(rt.settings))
            archived = [e.message_id for f in files for e in dlq.read_archive(f)[0]]
            assert set(dead) <= set(archived)
    finally:
        code = stop_process(proc)
    assert code == 0, log.read_text()
    assert "scheduler stopped" in log.read_text()


def test_two_scheduler_processes_fire_each_heartbeat_slot_once(tmp_path: Path) -> None:
    home = write_home(tmp_path / "home", f"sqlite:///{tmp_path / 'a.db'}", FAST)
    logs = [tmp_path / "one.log", tmp_path / "two.log"]
    procs = [start_process(home, "scheduler", log) for log in logs]
    try:
        wait_until(lambda: len(_heartbeats(home)) >= 5, 40, what="five heartbeat slots")
    finally:
        for p in procs:
            assert stop_process(p) == 0
    beats = _heartbeats(home)
    slots = [json.loads(str(b["metadata"]))["slot"] for b in beats]
    assert len(slots) == len(set(slots)), "a slot was fired twice"
    seconds = sorted(int(datetime.fromisoformat(s).timestamp()) for s in slots)
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), "a slot was skipped"
    texts = [log.read_text() for log in logs]
    fired = sum(t.count(" fired as ") for t in texts)
    refused = sum(t.count("already fired by another scheduler") for t in texts)
    assert fired == len(beats)  # every message was fired by exactly one of the two
    assert refused >= len(beats) - 2  # and the other one tried the same slot (both ran the whole time)


def _schedulers(home: Path) -> list[tuple[str, bool]]:
    """The scheduler processes /metrics reports (``agentpost_process_up{kind="scheduler"}``): name, up."""
    with open_runtime(home, env={}) as rt:
        return [(p.name, p.up) for p in read_figures(rt.db).processes if p.kind == "scheduler"]


def test_metrics_show_a_scheduler_up_until_it_is_killed_and_forget_one_that_stopped(tmp_path: Path) -> None:
    home = write_home(tmp_path / "home", f"sqlite:///{tmp_path / 'a.db'}", FAST)
    killed = start_process(home, "scheduler", tmp_path / "killed.log")
    try:
        seen = wait_until(lambda: _schedulers(home), 30, what="the scheduler's heartbeat row")
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=15)
    assert [(name.split(":")[1], up) for name, up in seen] == [(str(killed.pid), True)]
    # Killed: its row stays (nothing withdrew it), and on this host its pid tells it is gone.
    assert _schedulers(home) == [(seen[0][0], False)]
    stopped = start_process(home, "scheduler", tmp_path / "stopped.log")
    try:
        wait_until(lambda: len(_schedulers(home)) == 2, 30, what="the second scheduler's row")
        assert sorted(up for _, up in _schedulers(home)) == [False, True]
    finally:
        assert stop_process(stopped) == 0
    assert _schedulers(home) == [(seen[0][0], False)]  # a scheduler that stopped takes its row with it


def test_kill_mid_archive_loses_nothing_and_archives_nothing_twice(tmp_path: Path) -> None:
    extra = "[scheduler]\ndlq_archive_age_hours = 0\ncatchup_seconds = 0\n"
    home = write_home(tmp_path / "home", f"sqlite:///{tmp_path / 'a.db'}", extra)
    with open_runtime(home, env={}) as rt:
        ids = make_dead(rt.queue, 5)
        directory = dlq.dlq_dir(rt.settings)
    log = tmp_path / "scheduler.log"
    proc = start_process(home, "scheduler", log, env=cli_env(home, {dlq.PAUSE_ENV: "60"}))
    try:
        wait_until(lambda: "pausing" in log.read_text(), 30, what="the archive to be written and fsynced")
        files = dlq.archive_files(directory)
        assert sorted(e.message_id for e in dlq.read_archive(files[0])[0]) == sorted(ids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    with open_runtime(home, env={}) as rt:
        assert count(rt.queue, "dead") == 5  # the delete never committed: still in the database
    proc = start_process(home, "scheduler", tmp_path / "again.log")
    try:
        with open_runtime(home, env={}) as rt:
            wait_until(lambda: count(rt.queue, "dead") == 0, 30, what="the second archive run")
    finally:
        stop_process(proc)
    entries = [e for f in dlq.archive_files(directory) for e in dlq.read_archive(f)[0]]
    assert sorted(e.message_id for e in entries) == sorted(ids)  # each once: nothing lost, nothing twice

    name = dlq.archive_files(directory)[0].name
    out = run_cli(home, "dlq", "restore", name)
    assert "restored 5" in out.stdout
    out = run_cli(home, "dlq", "restore", name)
    assert "restored 0" in out.stdout and "already restored before (skipped) 5" in out.stdout
    status = json.loads(run_cli(home, "dlq", "status", "--json").stdout)
    assert status["archived_entries"] == 5 and status["dead_in_database"] == 0
    listed = json.loads(run_cli(home, "dlq", "list", "--json").stdout)
    assert sorted(e["message"]["message_id"] for e in listed["entries"]) == sorted(ids)
    assert all(e["restored"] for e in listed["entries"])
    with open_runtime(home, env={}) as rt:
        assert count(rt.queue, "pending") == 5


def test_scheduler_process_takes_backups_on_its_timer_and_keeps_the_newest(tmp_path: Path) -> None:
    backups_dir = tmp_path / "copies"
    home = write_home(
        tmp_path / "home",
        f"sqlite:///{tmp_path / 'a.db'}",
        f'[backup]\nevery = "1s"\nkeep = 2\ndir = "{backups_dir}"\n',
    )
    with open_runtime(home, env={}) as rt:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "kept in every copy")
    log = tmp_path / "scheduler.log"
    proc = start_process(home, "scheduler", log)
    seen: set[str] = set()

    def copies() -> list[str]:
        names = sorted(p.name for p in backups_dir.glob("agentpost-*.db")) if backups_dir.exists() else []
        seen.update(names)
        # keep, and one more for a moment: the oldest goes only once the new copy is complete.
        assert len(names) <= 3, names
        return names

    try:
        wait_until(lambda: copies() is not None and len(seen) >= 4, 60, what="four scheduled copies")
    finally:
        assert stop_process(proc) == 0, log.read_text()
    wait_until(lambda: len(copies()) == 2, 10, what="the newest two copies left")
    assert "backup written" in log.read_text()
    with open_runtime(home, env={}) as rt:
        last = last_good_backup(rt.db)
    assert last is not None and last.scheduled and Path(last.file).name in seen
