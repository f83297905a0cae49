"""kill -9 of a real processor around a teammate's dead-lettering: the chat its chain started from is told
once, never twice.

The notice is written in the transaction that buries the teammate's message, so a kill lands either before it
(the message is run again, or buried by the recovery that takes it back) or after it (nothing is left to do):
never between. Two ways there, each with ``agentpost run processor`` processes killed and restarted:

- mate fails at once, and the processor is killed the moment mate's run starts, in each of several chains:
  the kill falls just before or just after the failure is written;
- mate hangs, the processor is killed mid-run and ``max_interrupted_runs = 1``: the successor's recovery
  buries mate (the scheduler's and the processor's stale-claim path) and tells the chat; a second kill and
  restart tells it nothing more.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.channel_support import Proc
from tests.integration.test_chain_failures import TEAM_SCRIPT, chat_replies, notices
from tests.processor_support import count, make_home, open_home, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _home(tmp: Path, db_url: str, mode: str, **queue: object) -> Path:
    script = tmp / "team.py"
    script.write_text(TEAM_SCRIPT, encoding="utf-8")
    (tmp / "mate_mode").write_text(mode)
    agent = {"provider": "command", "command": [sys.executable, str(script)]}
    return make_home(
        tmp,
        db_url,
        {"lead": agent, "mate": agent, "helper": agent},
        teams={"crew": {"agents": ["lead", "mate", "helper"], "leader": "lead"}},
        queue=dict(queue),
    )


def _mate_runs(tmp: Path) -> list[int]:
    log = tmp / "mate_runs.log"
    return [int(p) for p in log.read_text().split()] if log.exists() else []


@contextlib.contextmanager
def _processors(home: Path, tmp: Path) -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for pid in _mate_runs(tmp):  # a hanging mate CLI outlives a killed processor
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _start(procs: list[Proc], home: Path, tmp: Path) -> Proc:
    proc = Proc("processor", home, {}, tmp / f"processor-{len(procs)}.log")
    procs.append(proc)
    return proc


def _settled(rt: Runtime) -> bool:
    return count(rt, "SELECT COUNT(*) FROM messages WHERE status IN ('pending', 'processing')") == 0


def test_a_kill_around_a_failing_teammate_never_tells_the_chat_twice(tmp_path: Path, db_url: str) -> None:
    home = _home(tmp_path, db_url, "permanent")
    chats = [ChatAddress("cli", "me", conversation=f"c{n}") for n in range(3)]
    with open_home(home) as rt, _processors(home, tmp_path) as procs:
        # Killed 0, 30 and 100 ms after mate's CLI starts (it fails within a few ms): before the failure
        # is written, and after.
        for chat, delay in zip(chats, (0.0, 0.03, 0.1), strict=True):
            runs = len(_mate_runs(tmp_path))
            processor = _start(procs, home, tmp_path)
            rt.queue.intake.enqueue_message(chat, "@crew ask mate")
            deadline = time.monotonic() + 30
            while len(_mate_runs(tmp_path)) == runs and time.monotonic() < deadline:
                time.sleep(0.002)
            time.sleep(delay)
            processor.kill()
        _start(procs, home, tmp_path)
        wait_for(lambda: _settled(rt), 60, "every chain settled")
        dead = rt.db.read("SELECT message_id, conversation FROM messages WHERE status = 'dead' ORDER BY id")
        told = {chat.conversation: notices(chat_replies(rt, chat)) for chat in chats}
    # mate's message of each chain is in the internal conversation named after the chat it started from
    assert sorted(r["conversation"] for r in dead) == sorted(chat.row_key for chat in chats)
    for row in dead:
        (notice,) = told[row["conversation"].removeprefix("cli:")]
        assert "“mate” could not do its part" in notice and notice.endswith(f"(ref {row['message_id']})")


def test_a_teammate_buried_by_recovery_after_a_kill_is_told_once(tmp_path: Path, db_url: str) -> None:
    home = _home(tmp_path, db_url, "sleep", max_interrupted_runs=1)
    chat = ChatAddress("cli", "me")
    with open_home(home) as rt, _processors(home, tmp_path) as procs:
        first = _start(procs, home, tmp_path)
        rt.queue.intake.enqueue_message(chat, "@crew ask mate")
        wait_for(lambda: _mate_runs(tmp_path), 30, "mate's run to start")
        first.kill()
        second = _start(procs, home, tmp_path)
        wait_for(
            lambda: count(rt, "SELECT COUNT(*) FROM messages WHERE status = 'dead'") == 1, 30, "mate buried"
        )
        second.kill()  # and again, right after: the successor must not tell it a second time
        _start(procs, home, tmp_path)
        time.sleep(3)  # several recovery rounds of the third processor
        (ref,) = [
            r["message_id"] for r in rt.db.read("SELECT message_id FROM messages WHERE status = 'dead'")
        ]
        replies = chat_replies(rt, chat)
    assert len(_mate_runs(tmp_path)) == 1  # killed mid-run once: not run again
    assert [r["message"] for r in replies if r["metadata"].get("kind") != "dead_notice"] == [
        "**lead:** I will ask mate. → @mate: check the numbers"
    ]
    (notice,) = notices(replies)
    assert notice.startswith("Sorry — “mate” could not do its part of your request that “lead” handed to it")
    assert "stopped in the middle of it every time it tried" in notice and notice.endswith(f"(ref {ref})")
