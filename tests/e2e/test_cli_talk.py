"""`agentpost send --wait` and `agentpost chat` as a person runs them, beside a real `agentpost run processor`
process (a scripted command agent): a wait with no processor says so and goes on when one starts, earlier
unread replies are labelled, Ctrl-C says where the reply will be, and chat's `/retry` and `/status` work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.clock import now_ms
from shared.runtime import Runtime
from tests.homes import build_home, open_home
from tests.probes import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))

#: The agent: answers "answer: <the message>"; "sleep=N" first says it is working, then sleeps; "flaky"
#: fails while a file named "broken" lies beside the script.
AGENT = r"""
import os, sys, time
prompt = sys.stdin.read()
words = prompt.split()
for word in words:
    if word.startswith("sleep="):
        print("working on it", flush=True)
        time.sleep(float(word.split("=", 1)[1]))
if "flaky" in words and os.path.exists(os.path.join(os.path.dirname(os.path.abspath(__file__)), "broken")):
    print("the flaky part broke", file=sys.stderr)
    sys.exit(3)
print("answer: " + " ".join(words[-3:]))
"""


def _sigint_as_at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class Session:
    """A running `agentpost` command whose output (stdout and stderr together) is collected as it comes."""

    def __init__(self, home: Path, *args: str, stdin: bool = False) -> None:
        self.proc = subprocess.Popen(
            [AGENTPOST, *args],
            env=_env(home),
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_sigint_as_at_a_terminal,
        )
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), 4096):
            self._chunks.append(chunk)

    @property
    def text(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    def type(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def shows(self, fragment: str, timeout: float, count: int = 1) -> None:
        try:
            wait_for(lambda: self.text.count(fragment) >= count, timeout, repr(fragment))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the output so far:\n{self.text}") from None

    def finish(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), HOME=str(home), NO_COLOR="1", COLUMNS="200")
    return env


def _cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENTPOST, *args], env=_env(home), input=stdin, capture_output=True, text=True, timeout=90
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    script = tmp_path / "agent.py"
    script.write_text(AGENT, encoding="utf-8")
    return build_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'agentpost.db'}",
        {"assistant": {"provider": "command", "command": [sys.executable, str(script)]}},
        queue={"max_retries": 2},
    )


@pytest.fixture
def processors(home: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processors a test starts with :func:`start_processor`; killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def start_processor(home: Path, started: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """`agentpost run processor`, returned once it has announced itself in the event log."""
    log = (home / f"processor-{len(started)}.log").open("wb")
    proc = subprocess.Popen(
        [AGENTPOST, "run", "processor"], env=_env(home), stdout=log, stderr=subprocess.STDOUT
    )
    log.close()
    started.append(proc)
    with open_home(home) as rt:
        wait_for(lambda: _started(rt, proc.pid), 60, "the processor to start")
    return proc


def _started(rt: Runtime, pid: int) -> bool:
    return any(
        e.type == "processor_start" and e.payload.get("pid") == pid
        for e in rt.events.read("processor", limit=1000)
    )


def _status(rt: Runtime, message_id: str) -> str | None:
    message = rt.queue.admin.get_message(message_id)
    return None if message is None else message.status


def _broken(home: Path, broken: bool) -> None:
    flag = home.parent / "broken"
    if broken:
        flag.write_text("x")
    else:
        flag.unlink()


def test_send_wait_says_when_no_processor_runs_and_goes_on_when_one_starts(
    home: Path, processors: list[subprocess.Popen[bytes]]
) -> None:
    # A processor that was killed leaves its start behind in the event log: it must not count as running.
    killed = start_processor(home, processors)
    killed.kill()
    killed.wait(timeout=10)

    waiting = Session(home, "send", "--wait", "--timeout", "100", "hello there")
    try:
        waiting.shows("no processor is running", 20)
        line = next(ln for ln in waiting.text.splitlines() if "no processor is running" in ln)
        assert line == "queued; no processor is running — start it with `agentpost up`", waiting.text
        assert waiting.proc.poll() is None  # it keeps waiting

        start_processor(home, processors)
        assert waiting.finish() == 0, waiting.text
    finally:
        waiting.stop()
    assert "answer: hello there" in waiting.text
    assert waiting.text.count("no processor is running") == 1
    documented = " ".join(_cli(home, "send", "--help").stdout.split())
    assert "no processor is running" in documented and "keeps waiting" in documented


def test_send_wait_sees_a_processor_up_longer_than_the_event_log_keeps_its_start(
    home: Path, processors: list[subprocess.Popen[bytes]]
) -> None:
    # A processor that runs, but whose start event the event log has dropped, as it does once the start is
    # older than events.ttl_hours (72 h): the scheduler's prune, run here with that much time gone by.
    proc = start_processor(home, processors)
    with open_home(home) as rt:
        rt.events.cleanup(ttl_ms=0, max_per_topic=100_000)
        assert not _started(rt, proc.pid)
        # The agent is paused by a rate limit (as the processor records one), so the message waits with the
        # processor up, past the moment send --wait asks whether one runs.
        rt.queue.control.pause_agent("assistant", now_ms() + 9_000, "rate limited (test)")

    waiting = Session(home, "send", "--wait", "--timeout", "60", "hello there")
    try:
        code = waiting.finish(60)
    finally:
        waiting.stop()
    # Before: "queued; no processor is running — start it with `agentpost up`" after 5 s.
    assert code == 0, waiting.text
    assert "answer: hello there" in waiting.text
    assert "no processor is running" not in waiting.text, waiting.text


def test_send_wait_labels_earlier_replies_and_answers_with_its_own(
    home: Path, processors: list[subprocess.Popen[bytes]]
) -> None:
    start_processor(home, processors)
    _broken(home, True)
    flaky = _cli(home, "send", "flaky job").stdout.strip()
    with open_home(home) as rt:
        wait_for(lambda: _status(rt, flaky) == "dead", 60, "the dead letter")
        _broken(home, False)
        assert _cli(home, "dead", "retry", flaky).returncode == 0
        # Its dead notice and, after the retry, its answer (committed with the completion) wait unread.
        wait_for(lambda: _status(rt, flaky) == "completed", 60, "the retried answer")

    done = _cli(home, "send", "--wait", "second question")
    assert done.returncode == 0, done.stdout + done.stderr  # an earlier failure is not this message's
    lines = done.stdout.splitlines()
    labels = [i for i, ln in enumerate(lines) if ln.startswith("earlier reply to “flaky job”")]
    assert len(labels) == 2 and all(flaky in lines[i] for i in labels), done.stdout
    assert lines[labels[1] + 1] == "answer: flaky job", done.stdout
    own = lines.index("answer: second question")
    assert own > labels[1] and not lines[own - 1].startswith("earlier reply"), done.stdout
    assert done.stdout.count("answer: second question") == 1

    later = _cli(home, "send", "later one").stdout.strip()
    with open_home(home) as rt:
        wait_for(lambda: _status(rt, later) == "completed", 60, "the unread answer")
    result = json.loads(_cli(home, "send", "--wait", "--json", "json one").stdout)
    assert [r["text"] for r in result["replies"]] == ["answer: json one"]
    assert [(r["message_id"], r["text"]) for r in result["earlier_replies"]] == [(later, "answer: later one")]


def test_ctrl_c_while_waiting_says_where_the_reply_will_be(
    home: Path, processors: list[subprocess.Popen[bytes]]
) -> None:
    start_processor(home, processors)
    waiting = Session(home, "send", "--wait", "--id", "cli_slowjob1", "sleep=30 slow one")
    try:
        waiting.shows("working on it", 30)  # the agent's first step: the command is waiting
        waiting.proc.send_signal(signal.SIGINT)
        assert waiting.finish(20) == 130, waiting.text
    finally:
        waiting.stop()
    told = [ln for ln in waiting.text.splitlines() if "agentpost replies" in ln]
    assert len(told) == 1 and "cli_slowjob1" in told[0], waiting.text
    assert "Traceback" not in waiting.text and "Aborted" not in waiting.text


def test_chat_retry_waits_for_the_retried_answer(
    home: Path, processors: list[subprocess.Popen[bytes]]
) -> None:
    start_processor(home, processors)
    _broken(home, True)
    chat = Session(home, "chat", stdin=True)
    try:
        chat.type("flaky job")
        chat.shows("you> ", 60, count=2)  # the message ended (dead: its explanation shown), next prompt
        assert "answer: flaky job" not in chat.text
        _broken(home, False)
        chat.type("/retry")
        chat.shows("answer: flaky job", 60)  # shown before anything else is typed
        chat.shows("you> ", 10, count=3)
        chat.type("/exit")
        chat.finish()
    finally:
        chat.stop()
    assert "after your next message" not in chat.text
    assert chat.text.index("Trying your message again") < chat.text.index("answer: flaky job")


def test_chat_status_and_stop_name_the_chat_the_agent_works_for(
    home: Path, processors: list[subprocess.Popen[bytes]]
) -> None:
    start_processor(home, processors)
    idle = _cli(home, "chat", stdin="/status\n/exit\n")
    assert "Nothing is running or waiting for this chat." in idle.stdout, idle.stdout + idle.stderr
    # /stop with nothing to stop says so and leaves no request behind (the run below would meet it).
    assert "Nothing is running for this chat." in _cli(home, "chat", stdin="/stop\n/exit\n").stdout

    busy = _cli(home, "send", "sleep=30 busy job").stdout.strip()
    with open_home(home) as rt:
        wait_for(lambda: _status(rt, busy) == "processing", 30, "the run")
    shown = _cli(home, "chat", stdin="/status\n/exit\n")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "Unknown command" not in shown.stdout
    assert "Working on it since" in shown.stdout and "@assistant" in shown.stdout, shown.stdout
    assert "/status" in _cli(home, "chat", stdin="/help\n/exit\n").stdout

    # /stop names the same chat: the run (30 s of sleep) ends now.
    assert "Stopping" in _cli(home, "chat", stdin="/stop\n/exit\n").stdout
    with open_home(home) as rt:
        wait_for(lambda: _status(rt, busy) == "completed", 15, "the run to stop")
