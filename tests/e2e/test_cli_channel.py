"""The CLI as a real channel: `agentpost send --wait`, `agentpost chat` and `agentpost replies` as a user runs
them, with a real processor process running the real claude CLI against the fake API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes.anthropic_api import ApiError, FakeAnthropic, Text
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.homes import open_home
from tests.liveness_support import claude_home, cli_env
from tests.probes import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


@pytest.fixture
def home(tmp_path: Path, api: FakeAnthropic) -> Iterator[Path]:
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'agentpost.db'}")
    env = {**cli_env(api, tmp_path), "AGENTPOST_HOME": str(home)}
    out = (tmp_path / "processor.out").open("wb")
    proc = subprocess.Popen([AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield home
    finally:
        proc.kill()
        proc.wait(timeout=10)
        out.close()


def _cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AGENTPOST_HOME": str(home),
        "HOME": str(home),
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [AGENTPOST, *args], env=env, input=stdin, capture_output=True, text=True, timeout=90
    )


def test_send_wait_piped_prints_the_reply_once_and_acknowledges_it(home: Path, api: FakeAnthropic) -> None:
    api.add_rule("what is 2+2", Text("It is **4**."))
    done = _cli(home, "send", "--wait", "what is 2+2")  # stdout is a pipe
    assert done.returncode == 0, done.stderr
    # Piped: the reply as written, not terminal codes, and once (the agent's last text is not also a step).
    assert done.stdout.count("It is **4**.") == 1, done.stdout
    with open_home(home) as rt:
        assert rt.queue.admin.queue_status()["cli_replies_unread"] == 0
        assert rt.db.read_scalar("SELECT status FROM responses") == "acked"


def test_send_wait_json_and_an_error_ends_non_zero_with_the_explanation(
    home: Path, api: FakeAnthropic
) -> None:
    api.add_rule("poison", ApiError("this request is not acceptable"))
    failed = _cli(home, "send", "--wait", "--json", "poison")
    assert failed.returncode == 1
    result = json.loads(failed.stdout)
    assert result["status"] == "dead"
    (reply,) = result["replies"]
    assert (
        reply["kind"] == "dead_notice"
        and "refused" in reply["text"]
        and result["message_id"] in reply["text"]
    )
    assert "Traceback" not in failed.stderr


def test_a_reply_nobody_waited_for_is_shown_by_replies_once(home: Path, api: FakeAnthropic) -> None:
    api.add_rule("later please", Text("Here is your later answer."))
    sent = _cli(home, "send", "later please")
    assert sent.returncode == 0
    message_id = sent.stdout.strip()
    with open_home(home) as rt:
        wait_for(lambda: rt.queue.admin.queue_status()["cli_replies_unread"] == 1, 60, "the reply to arrive")
        trace = _cli(home, "trace", message_id).stdout
        assert "agentpost replies" in trace and "adapter running" not in trace
    first = _cli(home, "replies")
    assert first.returncode == 0 and "Here is your later answer." in first.stdout
    again = _cli(home, "replies")
    assert "No unread replies." in again.stdout and "later answer" not in again.stdout


def test_chat_answers_each_line_and_continues_the_conversation(home: Path, api: FakeAnthropic) -> None:
    api.add_rule("my name is ann", Text("Hello Ann."))
    api.add_rule("what is my name", Text("You told me: Ann."))
    session = _cli(home, "chat", stdin="my name is ann\nwhat is my name\n/exit\n")
    assert session.returncode == 0, session.stderr
    assert session.stdout.index("Hello Ann.") < session.stdout.index("You told me: Ann.")
    second = [r for r in api.main_requests() if r.last_user_text.endswith("what is my name")]
    assert second and "my name is ann" in str(second[-1].body)  # one conversation across the lines


def test_chat_reset_starts_a_fresh_conversation(home: Path, api: FakeAnthropic) -> None:
    api.add_rule("my name is bob", Text("Hello Bob."))
    api.add_rule("who am i", Text("I do not know."))
    session = _cli(home, "chat", stdin="my name is bob\n/reset\nwho am i\n/exit\n")
    assert session.returncode == 0, session.stderr
    assert "Started a fresh conversation with @coder." in session.stdout
    last = [r for r in api.main_requests() if r.last_user_text.endswith("who am i")]
    assert last and "my name is bob" not in str(last[-1].body)  # the session before /reset is not resumed
