"""Liveness with real processes: ``agentpost run processor`` running the real Claude Code CLI against the fake
API. A SIGKILLed processor's message is re-run by its successor with the "interrupted" note, and a /stop
written by another process (this test) ends a run within seconds while /status reports it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.reads.conversation_status import conversation_status
from tests.fakes.anthropic_api import Chunked, FakeAnthropic
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env, of_kind, payloads, process_gone
from tests.probes import kill_all
from tests.processor_support import open_home, wait_for
from workers.busy import INTERRUPTED_NOTE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


class Processors:
    """``agentpost run processor`` processes, killed at the end of the test."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env = tmp, env
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, home: Path, name: str) -> subprocess.Popen[bytes]:
        env = {**self.env, "AGENTPOST_HOME": str(home), "AGENTPOST_LOG_LEVEL": "INFO"}
        with open(self.tmp / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(
                [AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        self.started.append(proc)
        return proc

    def kill_all(self) -> None:
        kill_all(self.started)


@pytest.fixture
def procs(tmp_path: Path, api: FakeAnthropic) -> Iterator[Processors]:
    env = cli_env(api, tmp_path)
    env["PATH"] = os.environ.get("PATH", env["PATH"])
    processes = Processors(tmp_path, env)
    yield processes
    processes.kill_all()


def test_sigkill_mid_run_then_the_rerun_is_told_it_was_interrupted(
    tmp_path: Path, api: FakeAnthropic, procs: Processors
) -> None:
    slow = api.add_rule("migrate the database", Chunked(["step "] * 40, interval=0.5), times=1)
    home = claude_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'agentpost.db'}",
        queue={"lease_seconds": 2},
        processor={"progress_note_seconds": 1.0},
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "migrate the database"
        )
        first = procs.start(home, "first")
        wait_for(
            lambda: slow.hits == 1 and of_kind(rt, "progress"), 30, "the first run to stream and post a note"
        )
        (start,) = payloads(rt, "chain_step_start")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        procs.start(home, "second")
        wait_for(
            lambda: (
                (m := rt.queue.admin.get_message(sent.message_id)) is not None and m.status == "completed"
            ),
            40,
            "the message to complete after the restart",
        )
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.interruptions == 1 and (msg.last_error or "").startswith("interrupted")
        (final,) = of_kind(rt, "final")
        assert final["metadata"]["edit_key"] != start["run_id"]  # a new run, a new note to edit
    rerun = api.main_requests()[-1]
    assert rerun.last_user_text.startswith(INTERRUPTED_NOTE)
    assert rerun.last_user_text.endswith("migrate the database")


def test_stop_from_another_process_ends_the_run_within_seconds(
    tmp_path: Path, api: FakeAnthropic, procs: Processors
) -> None:
    api.add_rule("endless", Chunked(["tick "] * 80, interval=0.5))  # 40 s unless stopped
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'agentpost.db'}")
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "endless job"
        )
        procs.start(home, "processor")
        api.wait_for_main_requests(1, 30)  # the CLI is running and streaming
        status = wait_for(
            lambda: (
                (s := conversation_status(rt.db, "coder", ChatAddress("telegram", conversation="c1")))[
                    "running"
                ]
                and s
            ),
            30,
            "/status to report the run",
        )
        assert status["message_ids"] == [sent.message_id]
        asked = time.monotonic()
        rt.queue.control.request_stop("coder", "telegram:c1")
        wait_for(lambda: of_kind(rt, "stopped"), 10, "the stopped reply")
        assert time.monotonic() - asked < 5
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "completed"
        done = wait_for(lambda: payloads(rt, "chain_step_done"), 5, "the run's end event")
        wait_for(lambda: process_gone(int(done[0]["pid"])), 5, "the stopped CLI to be gone")
        assert (
            conversation_status(rt.db, "coder", ChatAddress("telegram", conversation="c1"))["running"]
            is False
        )
        assert not of_kind(rt, "final")
