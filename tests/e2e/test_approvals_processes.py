"""Asking before a tool runs, with the real processes: ``agentpost run processor`` runs the real claude CLI
(``permission_mode = "ask"``) against a fake API that asks for Bash, and an operator answers with the
``agentpost approvals`` command as a user types it — or nobody answers, or the processor is killed while the
request waits.

Wanted: ``approvals list --json`` shows the request (id, agent, tool, command); ``allow`` lets the command
run, ``deny`` keeps it from running, silence past ``approval_timeout_seconds`` denies it, the chat is told
each outcome; after ``kill -9`` of the processor the message is asked again, answered once: 0 duplicate
finals, 0 lost, the command run once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.queue import approvals
from shared.runtime import Runtime
from tests.approval_support import asking_model, command_runs
from tests.crash_support import ProcessorProcess, cli_pids, processor_env
from tests.fakes.anthropic_api import (
    Computed,
    FakeAnthropic,
)
from tests.fault_support import fresh_pg_database
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.homes import build_home
from tests.liveness_support import process_gone
from tests.probes import wait_for
from tests.processor_support import open_home

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))
CHAT = ChatAddress("telegram", "ann", sender_id="7", conversation="7")


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        fake.add_rule(None, Computed(asking_model))
        yield fake


def _home(tmp: Path, db_url: str, timeout: float) -> Path:
    return build_home(
        tmp,
        db_url,
        {"assistant": {"provider": "claude", "permission_mode": "ask"}},
        processor={"approval_timeout_seconds": timeout, "session_idle_seconds": 0},
        fast=False,
    )


def agentpost(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), COLUMNS="200", NO_COLOR="1")
    return subprocess.run([AGENTPOST, *args], env=env, capture_output=True, text=True, timeout=60)


def _waiting(home: Path) -> list[dict[str, Any]]:
    listed = agentpost(home, "approvals", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    found: list[dict[str, Any]] = json.loads(listed.stdout)
    return found


def _wait_for_request(home: Path, not_id: str = "") -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def one() -> bool:
        found[:] = [r for r in _waiting(home) if r["id"] != not_id]
        return len(found) == 1

    wait_for(one, 60, "one waiting request")
    return found[0]


def _status(rt: Runtime, message_id: str) -> str:
    message = rt.queue.admin.get_message(message_id)
    return message.status if message is not None else ""


def _responses(rt: Runtime, message_id: str, kind: str) -> list[str]:
    rows = rt.db.read(
        "SELECT message, metadata FROM responses WHERE message_id = :m ORDER BY id", {"m": message_id}
    )
    return [str(r["message"]) for r in rows if json.loads(r["metadata"] or "{}").get("kind") == kind]


def test_an_operator_allows_and_denies_from_the_cli_and_silence_denies(
    tmp_path: Path, api: FakeAnthropic
) -> None:
    home = _home(tmp_path, f"sqlite:///{tmp_path / 'agentpost.db'}", timeout=20)
    proc = ProcessorProcess(processor_env(api, tmp_path, home), tmp_path / "processor.log")
    rt = open_home(home)
    try:
        # Allowed: the command runs once the operator says so, not before.
        allowed = rt.queue.intake.enqueue_message(CHAT, "write marker-1").message_id
        request = _wait_for_request(home)
        assert (request["agent"], request["tool"], request["command"]) == (
            "assistant",
            "Bash",
            "echo ran >> marker-1.txt",
        )
        assert request["id"].startswith("apr_") and request["message_id"] == allowed
        assert command_runs(home, 1) == 0
        done = agentpost(home, "approvals", "allow", request["id"])
        assert done.returncode == 0 and "Allowed by operator" in done.stdout, done
        wait_for(lambda: _status(rt, allowed) == "completed", 60, "the allowed message answered")
        assert command_runs(home, 1) == 1
        assert _responses(rt, allowed, "final")[0].startswith("TOOL RAN")
        # A second answer to the same request changes nothing and says why.
        again = agentpost(home, "approvals", "deny", request["id"])
        assert again.returncode == 1 and "already answered" in again.stderr

        # Denied: the command never runs; the reply says what was not done.
        denied = rt.queue.intake.enqueue_message(CHAT, "write marker-2").message_id
        request = _wait_for_request(home)
        assert agentpost(home, "approvals", "deny", request["id"]).returncode == 0
        wait_for(lambda: _status(rt, denied) == "completed", 60, "the denied message answered")
        assert command_runs(home, 2) == 0
        (final,) = _responses(rt, denied, "final")
        assert final.startswith("TOOL FAILED") and final.endswith("(denied).")

        # Nobody answers: denied once its time is out, and the chat is told.
        silent = rt.queue.intake.enqueue_message(CHAT, "write marker-3").message_id
        _wait_for_request(home)
        wait_for(lambda: _status(rt, silent) == "completed", 60, "the unanswered message answered")
        assert command_runs(home, 3) == 0
        assert "(no answer within" in _responses(rt, silent, "final")[0]
        # The chat saw each question, then what became of it.
        closed = [_responses(rt, m, "approval_closed") for m in (allowed, denied, silent)]
        assert [c[0].split(" ", 1)[0] for c in closed] == ["✅", "🚫", "⌛"], closed
        assert all(len(_responses(rt, m, "approval")) == 1 for m in (allowed, denied, silent))
        assert agentpost(home, "approvals", "list").stdout.strip().startswith("no request waits")
    finally:
        proc.stop()
        rt.close()


def _killed_while_waiting(tmp_path: Path, api: FakeAnthropic, db_url: str) -> None:
    home = _home(tmp_path, db_url, timeout=120)
    env = processor_env(api, tmp_path, home)
    procs = [ProcessorProcess(env, tmp_path / "processor-0.log")]
    rt = open_home(home)
    try:
        message = rt.queue.intake.enqueue_message(CHAT, "write marker-4").message_id
        first = _wait_for_request(home)
        cli = cli_pids(procs[0].pid)
        assert cli, "no claude CLI under the processor while the request waits"
        procs[0].kill9()
        wait_for(lambda: all(process_gone(pid) for pid in cli), 10, "the CLI to die with the processor")
        assert command_runs(home, 4) == 0
        procs.append(ProcessorProcess(env, tmp_path / "processor-1.log"))
        # The message runs again and asks again; the first request is over, and says so when answered.
        second = _wait_for_request(home, not_id=first["id"])
        late = agentpost(home, "approvals", "allow", first["id"])
        assert late.returncode == 1 and "expired" in late.stderr, late
        assert approvals.get(rt.db, first["id"]).status == "expired"  # type: ignore[union-attr]
        assert agentpost(home, "approvals", "allow", second["id"]).returncode == 0
        wait_for(lambda: _status(rt, message) == "completed", 90, "the message answered")
        procs[-1].stop()
        finals = _responses(rt, message, "final")
        questions = _responses(rt, message, "approval")
        closed = _responses(rt, message, "approval_closed")
    finally:
        for p in procs:
            if p.alive():
                p.kill9()
        rt.close()
    print(
        f"[ask kill -9 {db_url.split(':')[0]}] finals={len(finals)} questions={len(questions)} "
        f"command runs={command_runs(home, 4)}"
    )
    assert len(finals) == 1 and finals[0].startswith("TOOL RAN"), finals  # 0 lost, 0 duplicate finals
    assert command_runs(home, 4) == 1  # the command ran once
    assert len(questions) == 2  # asked again after the crash
    assert closed[0].startswith("↻") and closed[1].startswith("✅"), closed


def test_sqlite_processor_killed_while_a_request_waits_asks_again_and_answers_once(
    tmp_path: Path, api: FakeAnthropic
) -> None:
    _killed_while_waiting(tmp_path, api, f"sqlite:///{tmp_path / 'agentpost.db'}")


@pytest.mark.postgres
def test_postgres_processor_killed_while_a_request_waits_asks_again_and_answers_once(
    tmp_path: Path, api: FakeAnthropic
) -> None:
    with fresh_pg_database() as url:
        _killed_while_waiting(tmp_path, api, url)


def _pty_run(
    home: Path, args: list[str], answer: bytes, prompt: bytes, timeout: float = 90
) -> tuple[int, str]:
    """Run ``agentpost ARGS`` on a terminal of its own; type ``answer`` once ``prompt`` shows. Returns the
    exit status and everything the terminal showed."""
    import pty
    import select
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), COLUMNS="120", TERM="xterm")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [AGENTPOST, *args], stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
    )
    os.close(slave)
    seen, typed = b"", False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the other end closed: the command exited
                    break
                seen += chunk
                if not typed and prompt in seen:
                    os.write(master, answer)
                    typed = True
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=10) if proc.poll() is not None or typed else -1
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return code, seen.decode(errors="replace")


def test_send_wait_asks_at_the_terminal_and_prints_the_commands_when_piped(
    tmp_path: Path, api: FakeAnthropic
) -> None:
    home = _home(tmp_path, f"sqlite:///{tmp_path / 'agentpost.db'}", timeout=120)
    proc = ProcessorProcess(processor_env(api, tmp_path, home), tmp_path / "processor.log")
    try:
        # At a terminal: the question is asked there, "y" allows it, the reply follows.
        code, shown = _pty_run(
            home, ["send", "-w", "write marker-7"], b"y\r", b"Allow? [y]es / [n]o / [a]lways in this chat:"
        )
        assert code == 0, shown
        assert "assistant asks to use Bash" in shown and "echo ran >> marker-7.txt" in shown
        assert "Allowed by cli" in shown and "TOOL RAN" in shown, shown
        assert command_runs(home, 7) == 1
        # Piped: printed with the commands that answer it; an operator allows it from elsewhere.
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
        env.update(AGENTPOST_HOME=str(home), NO_COLOR="1")
        waiting = subprocess.Popen(
            [AGENTPOST, "send", "-w", "--timeout", "90", "write marker-8"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        request = _wait_for_request(home)
        assert agentpost(home, "approvals", "allow", request["id"]).returncode == 0
        out, err = waiting.communicate(timeout=90)
        assert waiting.returncode == 0, err
        assert f"Answer with: agentpost approvals allow {request['id']}" in out
        assert "TOOL RAN" in out and command_runs(home, 8) == 1
    finally:
        proc.stop()
