"""The processor as real OS processes (``agentpost run processor``): crash, restart, shutdown, two at once.

The agents run the scripted CLI of ``tests/processor_support.py`` through the ``command`` provider; its
invocation log (start/end lines with pid and time) is the evidence of what actually ran and when.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.liveness_support import process_gone
from tests.probes import kill_all
from tests.processor_support import (
    agent_script,
    command_agent,
    count,
    make_home,
    open_home,
    overlapping,
    read_invocations,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


class Processes:
    """Started processor processes; all are killed at the end of the test."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, home: Path, log: Path, name: str) -> subprocess.Popen[bytes]:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(self.tmp),
            "AGENTPOST_HOME": str(home),
            "AGENT_LOG": str(log),
            "AGENTPOST_LOG_LEVEL": "INFO",
        }
        out = open(self.tmp / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process below
        proc = subprocess.Popen(
            [AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
        out.close()
        self.started.append(proc)
        return proc

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.out").read_text(errors="replace")

    def kill_all(self) -> None:
        kill_all(self.started)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    processes = Processes(tmp_path)
    yield processes
    processes.kill_all()


def _solo_home(tmp: Path, **sections: Mapping[str, Any]) -> tuple[Path, Path]:
    """A SQLite home whose one agent, ``solo``, runs the scripted CLI (``sections``: settings tables for
    :func:`make_home`); returns the home and the CLI's invocation log."""
    script = agent_script(tmp)
    home = make_home(tmp, f"sqlite:///{tmp / 'agentpost.db'}", {"solo": command_agent(script)}, **sections)
    return home, tmp / "runs.log"


def _status(rt: Runtime, message_id: str) -> str:
    msg = rt.queue.admin.get_message(message_id)
    assert msg is not None
    return msg.status


def test_sigkill_mid_run_then_restart_runs_it_once_more_without_waiting_for_the_lease(
    tmp_path: Path, procs: Processes
) -> None:
    home, log = _solo_home(tmp_path, queue={"lease_seconds": 30})
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="1", conversation="c"), "long job sleep=2.5"
        )
        first = procs.start(home, log, "first")
        (run1,) = wait_for(lambda: read_invocations(log), 20, "the first run to start")
        lease_until = int(
            rt.db.read_scalar(
                "SELECT lease_until FROM messages WHERE message_id = :m", {"m": sent.message_id}
            )
        )
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        # The CLI dies with its processor (parent-death signal), so it cannot run beside a successor.
        wait_for(lambda: process_gone(run1.pid), 5, "the orphaned CLI to die")
        assert _status(rt, sent.message_id) == "processing"

        procs.start(home, log, "second")
        wait_for(
            lambda: _status(rt, sent.message_id) == "completed", 30, "the message to complete after restart"
        )
        runs = read_invocations(log)
        assert len(runs) == 2 and runs[0].end is None and runs[1].end is not None
        # The restarted processor on this host sees its predecessor is gone: no 30 s wait for the lease.
        assert runs[1].start * 1000 < lease_until - 20_000, "waited for the lease of a worker known dead"
        assert count(rt, "SELECT COUNT(*) FROM responses WHERE message_id = :m", {"m": sent.message_id}) == 1
        msg = rt.queue.admin.get_message(sent.message_id)
        # The interrupted run counted once, as an interruption (not one of the retries meant for errors).
        assert msg is not None and msg.interruptions == 1 and msg.retry_count == 0
        time.sleep(0.5)
        assert count(rt, "SELECT COUNT(*) FROM responses") == 1 and len(read_invocations(log)) == 2


def test_sigterm_lets_the_current_run_finish(tmp_path: Path, procs: Processes) -> None:
    home, log = _solo_home(tmp_path)
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "job sleep=1.5")
        proc = procs.start(home, log, "p")
        wait_for(lambda: read_invocations(log), 20, "the run to start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, procs.output("p")
        assert _status(rt, sent.message_id) == "completed"
        assert count(rt, "SELECT COUNT(*) FROM responses") == 1
        assert "processor_stop" in [r["type"] for r in rt.db.read("SELECT type FROM events")]


def test_sigterm_past_the_grace_period_releases_without_counting_an_attempt(
    tmp_path: Path, procs: Processes
) -> None:
    home, log = _solo_home(tmp_path, processor={"shutdown_grace_seconds": 0.5})
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "job sleep=30")
        proc = procs.start(home, log, "p")
        (run,) = wait_for(lambda: read_invocations(log), 20, "the run to start")
        # `kill -USR1` (README) writes every thread's stacks to the log, and the processor goes on.
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: "most recent call first" in procs.output("p"), 20, "the stacks in the log")
        assert proc.poll() is None and "run_processor" in procs.output("p")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, procs.output("p")
        # Its log says which run the shutdown waited for before cutting it short.
        waited = [line for line in procs.output("p").splitlines() if "for the runs going on:" in line]
        assert len(waited) == 1 and sent.message_id in waited[0], procs.output("p")
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "pending" and msg.retry_count == 0
        assert msg.available_at <= int(time.time() * 1000)
        assert "released" in (msg.last_error or "")
        assert process_gone(run.pid)
        assert count(rt, "SELECT COUNT(*) FROM responses") == 0


def test_two_processors_never_run_one_agent_twice_and_lose_nothing(
    tmp_path: Path, db_url: str, procs: Processes
) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    agents = {name: command_agent(script) for name in ("a1", "a2", "a3")}
    # One agent at a time per processor, so the three agents must be shared between the two processors.
    home = make_home(tmp_path, db_url, agents, processor={"max_concurrency": 1})
    with open_home(home) as rt:
        procs.start(home, log, "p1")
        procs.start(home, log, "p2")
        sent: list[str] = []
        for wave in range(3):
            for agent in agents:
                for chat in range(2):
                    text = f"w{wave} sleep=0.2 {agent} {chat}"
                    sent.append(
                        rt.queue.intake.enqueue_message(
                            ChatAddress("api", "u", conversation=f"c{chat}"), text, agent=agent
                        ).message_id
                    )
            time.sleep(0.3)
        wait_for(
            lambda: count(rt, "SELECT COUNT(*) FROM messages WHERE status = 'completed'") == len(sent),
            60,
            "every message to complete",
        )
        time.sleep(0.5)  # anything run twice would show up now
        assert count(rt, "SELECT COUNT(*) FROM messages WHERE status <> 'completed'") == 0
        ready = [
            json.loads(r["payload"])
            for r in rt.db.read("SELECT payload FROM events WHERE type = 'response_ready'")
        ]
        # A wave that arrives while its chat's run goes on gets a busy note: a reply of its own (proactive,
        # completing nothing), so only the replies that complete messages name message ids.
        finals = [payload for payload in ready if not payload.get("proactive")]
        completed_ids = [mid for payload in finals for mid in payload["message_ids"]]
        assert sorted(completed_ids) == sorted(sent), "a message was lost or completed twice"
        assert count(rt, "SELECT COUNT(*) FROM responses") == len(ready)
        workers = {
            json.loads(r["payload"])["worker"]
            for r in rt.db.read("SELECT payload FROM events WHERE type = 'chain_step_start'")
        }
        assert len(workers) == 2, "both processors should have run agents"
    runs = read_invocations(log)
    assert all(r.end is not None for r in runs)
    for agent in agents:
        mine = [r for r in runs if r.agent == agent]
        assert mine and not overlapping(mine), f"agent {agent} ran in two places at once"
