"""Concurrency of the processor, with the ``command`` provider running a scripted CLI that logs its runs.

The scripted CLI (see ``tests/processor_support.py``) writes start/end lines with its pid and the time, so the
tests judge overlap and invocation counts from what really ran, not from the processor's own bookkeeping.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import anyio
import pytest

from shared.chat.address import ChatAddress
from tests.processor_support import (
    agent_script,
    command_agent,
    count,
    make_home,
    open_home,
    overlapping,
    read_invocations,
    run_idle,
    wait_for,
)
from workers.processor import Processor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _env(log: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "AGENT_LOG": str(log)}


def test_two_agents_run_in_parallel_and_each_one_run_at_a_time(tmp_path: Path, sqlite_url: str) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    home = make_home(tmp_path, sqlite_url, {"alpha": command_agent(script), "beta": command_agent(script)})
    with open_home(home) as rt:
        for agent in ("alpha", "beta"):
            for chat in range(5):  # five chats: five groups, so five runs of about one second each
                rt.queue.intake.enqueue_message(
                    ChatAddress("api", "u", conversation=f"c{chat}"), f"job sleep=1 chat{chat}", agent=agent
                )
        started = time.monotonic()
        stats = run_idle(rt, env=_env(log))
        elapsed = time.monotonic() - started
        assert count(rt, "SELECT COUNT(*) FROM messages WHERE status = 'completed'") == 10
        assert count(rt, "SELECT COUNT(*) FROM responses") == 10
    runs = read_invocations(log)
    assert stats.invocations == 10 and len(runs) == 10
    for agent in ("alpha", "beta"):
        mine = [r for r in runs if r.agent == agent]
        assert len(mine) == 5 and not overlapping(mine), f"{agent} ran twice at once"
    assert overlapping(runs), "the two agents never ran at the same time"
    assert 4.5 <= elapsed < 8.5, f"10 one-second runs of two agents took {elapsed:.1f} s (want ~5, not 10)"


def test_burst_to_a_busy_agent_becomes_at_most_two_runs(tmp_path: Path, sqlite_url: str) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    home = make_home(tmp_path, sqlite_url, {"solo": command_agent(script)})
    with open_home(home) as rt:
        first = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c"), "one sleep=1.5"
        )
        processor = Processor(rt, env=_env(log))
        ids = [first.message_id]

        def send_rest() -> None:
            # Wait until the first run is really under way, then send four more to the same chat.
            wait_for(lambda: read_invocations(log), 10, "the first run to start")
            for n in range(2, 6):
                ids.append(
                    rt.queue.intake.enqueue_message(
                        ChatAddress("telegram", "ann", sender_id="7", conversation="c"), f"msg {n}"
                    ).message_id
                )

        sender = threading.Thread(target=send_rest)
        sender.start()
        anyio.run(lambda: processor.run_until_idle(timeout=30))
        sender.join()
        runs = read_invocations(log)
        assert len(runs) <= 2 and processor.stats.invocations == len(runs)
        assert len(ids) == 5
        for mid in ids:
            msg = rt.queue.admin.get_message(mid)
            assert msg is not None and msg.status == "completed", (mid, msg and msg.status)
        responses = rt.db.read("SELECT message_id, message, metadata FROM responses ORDER BY id")
        answers = [r for r in responses if '"note":"busy"' not in str(r["metadata"])]
        assert len(answers) == len(runs) == 2 and len(responses) <= 3  # at most one note that the four wait
        assert "msg 2" in runs[1].prompt and "msg 5" in runs[1].prompt  # the four arrived as one batch


def test_timeout_kills_children_of_the_cli(tmp_path: Path, sqlite_url: str) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    # The retry waits a minute: on a loaded machine a short backoff could end before the processor sees its
    # queue idle, and a second run would start (and be killed the same way).
    home = make_home(
        tmp_path,
        sqlite_url,
        {"solo": command_agent(script, timeout_seconds=1.5)},
        queue={"backoff_base_seconds": 60.0},
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "spawn sleep=30")
        run_idle(rt, env=_env(log))
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "pending" and "timed out" in (msg.last_error or "")
    child = int(Path(str(log) + ".child").read_text())
    wait_for(lambda: _dead(child), 5, f"child {child} of the CLI to be killed")
    (run,) = read_invocations(log)
    assert run.end is None  # killed mid-sleep, never reached its end line


def test_failing_command_retries_then_dies_with_one_notice(tmp_path: Path, db_url: str) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    home = make_home(tmp_path, db_url, {"solo": command_agent(script)})
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("discord", "ann", sender_id="9", conversation="room"), "fail"
        )
        run_idle(rt, env=_env(log), include_delayed=True)
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "dead"
        assert "exited with code 3" in (msg.last_error or "") and "something broke" in (msg.last_error or "")
        responses = rt.db.read("SELECT * FROM responses ORDER BY id")
        notices = [r for r in responses if "dead_notice" in r["metadata"]]
        assert len(notices) == 1 and notices[0]["conversation"] == "room"
        assert "something broke" not in notices[0]["message"]
        assert len(responses) == 3  # and one "trying again" note per retry before it
    assert len(read_invocations(log)) == 3


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_a_run_whose_lease_was_taken_over_is_stopped_and_sends_nothing(
    tmp_path: Path, sqlite_url: str
) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    # Renewal deliberately slower than the lease, so another worker can take the messages over mid-run.
    home = make_home(
        tmp_path,
        sqlite_url,
        {"solo": command_agent(script)},
        queue={"lease_seconds": 1.0},
        processor={"renew_interval_seconds": 1.2, "recover_interval_seconds": 60},
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "long sleep=8")
        # A worker id of another host: only its lease speaks for it (a live one on this host is never
        # taken over before the stall ceiling).
        processor = Processor(rt, env=_env(log), worker_id="elsewhere:1:1")
        taken: list[str] = []

        def thief() -> None:
            wait_for(lambda: read_invocations(log), 10, "the run to start")
            deadline = time.monotonic() + 20
            while not taken and time.monotonic() < deadline:
                rt.queue.failures.recover_stale_messages()
                if rt.queue.messages.claim_all_pending_messages("solo", "thief", lease_ms=60_000):
                    taken.append("thief")
                time.sleep(0.02)

        other = threading.Thread(target=thief)
        other.start()
        started = time.monotonic()
        anyio.run(lambda: processor.run_until_idle(timeout=30))
        other.join()
        assert taken == ["thief"]
        assert time.monotonic() - started < 7, "the run should have been stopped, not finished"
        (run,) = read_invocations(log)
        assert run.end is None
        wait_for(lambda: _dead(run.pid), 5, "the stopped CLI to be gone")
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "processing" and msg.claimed_by == "thief"
        assert count(rt, "SELECT COUNT(*) FROM responses") == 0
        assert count(rt, "SELECT COUNT(*) FROM events WHERE type = 'lease_lost'") == 1
        assert processor.stats.lease_lost == 1
