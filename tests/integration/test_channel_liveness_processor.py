"""Liveness with the real processor (``agentpost run processor``, a scripted agent) and the Telegram adapter
in-process against the fake Bot API: a burst inside the debounce window is one claim and one run, whose
progress notes are one message edited in place and whose answer is exactly one final reply; /status
reports a running run and /stop ends it within seconds with one "stopped" reply."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from adapters.progress_notes import DONE_TEXT
from adapters.telegram import TelegramChannel
from shared.runtime import Runtime
from tests.channel_support import HoldingTelegram, Proc, RunningChannel, count, events, open_home, wait_for
from tests.fault_support import fault_home
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CHANNELS = {"telegram": {"allowlist": ["42"], "poll_timeout_seconds": 1, "typing_interval_seconds": 0.5}}
PROCESSOR = {"progress_note_seconds": 1.0, "control_interval_seconds": 0.2, "recover_interval_seconds": 0.5}


@pytest.fixture
def setup(tmp_path: Path, fake: HoldingTelegram) -> Iterator[tuple[Runtime, Callable[[], Proc]]]:
    """The runtime and the Telegram adapter running; the processor is started by the test (when it
    calls the second item), so a test can have messages waiting before any processor can take them."""
    home = fault_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS, processor=PROCESSOR)
    rt = open_home(home)
    started: list[Proc] = []

    def start() -> Proc:
        started.append(Proc("processor", home, {}, tmp_path / "processor.log"))
        return started[-1]

    channel = TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})
    try:
        with RunningChannel(channel):
            yield rt, start
    finally:
        for processor in started:
            processor.stop()
        rt.close()


def test_burst_is_one_run_with_notes_edited_and_one_final_reply(
    setup: tuple[Runtime, Callable[[], Proc]], fake: HoldingTelegram
) -> None:
    rt, start = setup
    for text in ("token-a first", "token-b second", "token-c third sleep=3.4"):
        fake.push_text(42, text)
    # The second message of the chat opened the debounce window: all three wait together for it to close
    # (a lone message would be available at once; the burst rule starts with the second one).
    burst = wait_for(
        lambda: (
            (rows := rt.db.read("SELECT available_at FROM messages WHERE status = 'pending'"))
            and len(rows) == 3
            and rows
        ),
        10,
        "the burst queued",
    )
    assert len({int(r["available_at"]) for r in burst}) == 1
    processor = start()
    wait_for(lambda: any("answered" in t for t in fake.texts(42)), 40, "the answer")
    wait_for(lambda: any(c.text == DONE_TEXT for c in fake.sent), 10, "the note marked done")
    claims = events(rt, "message_claimed")
    texts = fake.texts(42)
    edits = [c for c in fake.sent if c.method == "editMessageText"]
    assert len(claims) == 1 and len(claims[0]["message_ids"]) == 3, claims  # the burst: one claim
    assert len(events(rt, "chain_step_start")) == 1  # ... and one run
    assert count(rt, "SELECT COUNT(*) FROM messages WHERE status = 'completed'") == 3
    notes = [t for t in texts if t.startswith("Still working")]
    answers = [t for t in texts if "answered" in t]
    # One reply to the three folded messages, saying so.
    assert len(notes) == 1 and answers == [
        "(Answering your 3 messages together.)\nalpha answered token-a token-b token-c"
    ], texts
    assert texts == [notes[0], answers[0]]  # the note first, then exactly one final reply
    assert len(edits) >= 2 and all(e.params["message_id"] == edits[0].params["message_id"] for e in edits)
    assert [e.text for e in edits[:-1]] and all(
        (e.text or "").startswith("Still working") for e in edits[:-1]
    )
    assert edits[-1].text == DONE_TEXT
    assert "processor" in processor.kind


def test_status_and_stop_end_a_running_run_within_seconds(
    setup: tuple[Runtime, Callable[[], Proc]], fake: HoldingTelegram
) -> None:
    rt, start = setup
    start()
    fake.push_text(42, "token-long sleep=60")
    wait_for(lambda: events(rt, "chain_step_start"), 20, "the run to start")
    before = len(fake.texts(42))
    fake.push_text(42, "/status")
    wait_for(lambda: any("Working on it" in t for t in fake.texts(42)[before:]), 10, "the status")
    status = next(t for t in fake.texts(42) if "Working on it" in t)
    fake.push_text(42, "/stop")
    wait_for(lambda: "Stopping…" in fake.texts(42), 10, "the /stop answer")
    asked = time.monotonic()
    wait_for(lambda: any(t.startswith("Stopped.") for t in fake.texts(42)), 15, "the stopped reply")
    took = time.monotonic() - asked
    time.sleep(0.5)  # nothing more may follow: no second "stopped", no answer of the killed run
    texts = fake.texts(42)
    done = events(rt, "chain_step_done")
    row = rt.db.read(
        "SELECT status, metadata FROM responses WHERE message_id IN (SELECT message_id FROM messages)"
    )
    assert "@alpha" in status
    assert took < 5.0, f"/stop took {took:.1f} s"
    assert sum(t.startswith("Stopped.") for t in texts) == 1
    assert not any("answered" in t for t in texts)
    assert len(done) == 1 and done[0].get("stopped_by") == "stop"
    assert count(rt, "SELECT COUNT(*) FROM messages WHERE status = 'completed'") == 1
    assert [json.loads(r["metadata"])["kind"] for r in row] == ["stopped"]
    assert rt.queue.control.agent_state("alpha")["stop_requested"] == ""  # taken by the processor
