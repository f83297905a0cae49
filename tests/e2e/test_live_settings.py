"""Live settings with real processes: a running processor takes up an agent added with `agentpost agent
add` (no restart), and a broken settings file keeps the settings in force while doctor and the log say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.processor_support import agent_script, command_agent, make_home, open_home, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def _env(tmp: Path, home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp),
        "AGENTPOST_HOME": str(home),
        "AGENTPOST_LOG_LEVEL": "INFO",
        "NO_COLOR": "1",
        "COLUMNS": "200",
    }


def cli(tmp: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([AGENTPOST, *args], env=_env(tmp, home), capture_output=True, text=True, timeout=60)


@pytest.fixture
def processor(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """A home with agent ``solo`` and a running ``agentpost run processor``: (home, script, log file)."""
    script = agent_script(tmp_path)
    home = make_home(tmp_path, f"sqlite:///{tmp_path / 'agentpost.db'}", {"solo": command_agent(script)})
    log = tmp_path / "processor.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [AGENTPOST, "run", "processor"], env=_env(tmp_path, home), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: "processor_start" in _events(home), 30, "the processor to start")
        yield home, script, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _events(home: Path) -> list[str]:
    with open_home(home) as rt:
        return [r["type"] for r in rt.db.read("SELECT type FROM events ORDER BY id")]


def _status(rt: Runtime, message_id: str) -> str:
    msg = rt.queue.admin.get_message(message_id)
    return "" if msg is None else msg.status


def _reply(rt: Runtime, message_id: str) -> str:
    rows = rt.db.read(
        "SELECT agent, message FROM responses WHERE message_id = :m ORDER BY id", {"m": message_id}
    )
    return " | ".join(f"{r['agent']}: {r['message']}" for r in rows)


def test_an_agent_added_while_the_processor_runs_answers_without_a_restart(
    tmp_path: Path, processor: tuple[Path, Path, Path]
) -> None:
    home, script, log = processor
    added = cli(
        tmp_path, home, "agent", "add", "coder", "--provider", "command",
        "--command", sys.executable, "--command", str(script),
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert "take it up within a few seconds" in added.stdout
    assert "restart" not in added.stdout

    # Sent at once: the sender reads the new file; the processor must not fail the message as "not
    # configured" because its own look at the file is up to a second old.
    sent = cli(tmp_path, home, "send", "--agent", "coder", "--json", "hello new agent")
    assert sent.returncode == 0, sent.stderr
    message_id = json.loads(sent.stdout)["message_id"]
    with open_home(home) as rt:
        wait_for(lambda: _status(rt, message_id) == "completed", 30, "the new agent's run", interval=0.1)
        assert _reply(rt, message_id) == "coder: done: hello new agent"
    assert "settings reloaded" in log.read_text(errors="replace")


def test_a_broken_settings_file_keeps_the_old_settings_and_doctor_and_log_say_why(
    tmp_path: Path, processor: tuple[Path, Path, Path]
) -> None:
    home, _script, log = processor
    with open_home(home) as rt:  # opened before the break: routing as the processor knows it
        settings_file = home / "settings.toml"
        good = settings_file.read_text()
        settings_file.write_text(good + "\n[agents.broken\nprovider = 'claude'\n")
        wait_for(
            lambda: "settings not reloaded" in log.read_text(errors="replace"),
            15,
            "the processor to log the broken file",
        )
        result = rt.queue.intake.enqueue_message(ChatAddress("api", "tester"), "still here", agent="solo")
        wait_for(
            lambda: _status(rt, result.message_id) == "completed",
            30,
            "the old settings to keep working",
            interval=0.1,
        )
        assert _reply(rt, result.message_id) == "solo: done: still here"

    doctor = cli(tmp_path, home, "doctor", "--json")
    found = {(c["area"], c["name"]): c for c in json.loads(doctor.stdout)}
    assert doctor.returncode == 1
    assert found[("settings", "settings.toml")]["level"] == "fail"
    assert "not valid TOML" in found[("settings", "settings.toml")]["detail"]

    # Logged once for this change of the file, not on every look (the file is looked at every second).
    time.sleep(2.5)
    text = log.read_text(errors="replace")
    assert text.count("settings not reloaded") == 1, text[-2000:]

    # Fixed: taken up again, without a restart.
    settings_file.write_text(good + "\n[agents.extra]\nprovider = 'claude'\n")
    wait_for(
        lambda: log.read_text(errors="replace").count("settings reloaded") >= 1,
        15,
        "the fixed file to be reloaded",
    )
