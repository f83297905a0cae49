"""Live previews on Telegram with real processes: ``agentpost run telegram`` against the fake Bot API and
``agentpost run processor`` running the real Claude CLI against the fake Anthropic API, which streams a reply
over about five seconds. The chat sees the reply while it is written and ends with exactly one message
holding it; the same after the processor is killed mid-stream (the re-run finishes the killed run's
preview message)."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from adapters.previews import INTERRUPTED_TEXT, MORE_MARK
from adapters.progress_notes import DONE_IN_PREVIEW_TEXT
from tests.channel_support import HoldingTelegram, Proc, open_home, telegram_env, wait_for
from tests.fakes.anthropic_api import Chunked, FakeAnthropic
from tests.fixtures import anthropic_api, cli_installed, telegram_fake  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CHAT = 42
CHANNELS = {"telegram": {"allowlist": ["42"], "poll_timeout_seconds": 1, "typing_interval_seconds": 1}}
LINES = [f"Line {i} of the answer, written slowly." for i in range(1, 11)]
REPLY = "\n".join(LINES)


def streamed(interval: float = 0.5) -> Chunked:
    """The reply as ten text deltas ``interval`` apart (about five seconds in all)."""
    return Chunked([line + "\n" for line in LINES], interval=interval)


def _env(api: FakeAnthropic, tmp: Path) -> dict[str, str]:
    env = cli_env(api, tmp)
    env["PATH"] = os.environ.get("PATH", env["PATH"])
    return env


def first_seen(fake: HoldingTelegram, needle: str) -> float | None:
    """When a send or edit in the chat first carried ``needle`` (monotonic), or None."""
    for c in fake.sent:
        if c.chat_id == CHAT and c.method in ("sendMessage", "editMessageText") and needle in (c.text or ""):
            return c.at
    return None


def answered(fake: HoldingTelegram) -> bool:
    return any(m.get("text") == REPLY for m in fake.bot_messages(CHAT))


def test_reply_grows_in_one_message_that_becomes_the_answer(
    tmp_path: Path, fake: HoldingTelegram, api: FakeAnthropic
) -> None:
    api.add_rule("tell me slowly", streamed())
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=CHANNELS)
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    processor = Proc("processor", home, _env(api, tmp_path), tmp_path / "processor.log")
    began = time.monotonic()
    try:
        fake.push_text(CHAT, "tell me slowly")
        wait_for(lambda: answered(fake), 60, "the whole reply in the chat")
        time.sleep(1.5)  # nothing may touch the answer afterwards (a late preview edit would show here)
    finally:
        adapter.stop()
        processor.stop()
    record = fake.transcript(CHAT, began)
    first, last = first_seen(fake, LINES[0]), first_seen(fake, LINES[-1])
    assert first is not None and last is not None, record
    assert last - first >= 2.0, (
        f"the first line was visible only {last - first:.2f} s before the last\n{record}"
    )
    messages = fake.bot_messages(CHAT)
    assert [m["text"] for m in messages] == [REPLY], record
    edits = [c for c in fake.sent if c.chat_id == CHAT and c.method == "editMessageText"]
    assert edits and all(MORE_MARK not in (c.text or "") for c in edits[-1:]), record
    # At most about one edit a second (the platform's limit per chat), the final's own edit aside.
    gaps = [b.at - a.at for a, b in itertools.pairwise(edits[:-1])]
    assert all(g >= 0.9 for g in gaps), f"edits {gaps}\n{record}"


def test_processor_killed_mid_stream_the_rerun_finishes_the_killed_runs_preview(
    tmp_path: Path, fake: HoldingTelegram, api: FakeAnthropic
) -> None:
    """kill -9 of the processor while the reply streams: the re-run's text grows in the killed run's preview
    message, which becomes the whole answer; no half reply and no second message are left in the chat."""
    slow = api.add_rule("tell me slowly", Chunked([line + "\n" for line in LINES] * 4, interval=0.5), times=1)
    api.add_rule("tell me slowly", streamed(0.3))
    home = claude_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=CHANNELS, queue={"lease_seconds": 2}
    )
    env = _env(api, tmp_path)
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    first = Proc("processor", home, env, tmp_path / "processor.log")
    began = time.monotonic()
    second: Proc | None = None
    try:
        fake.push_text(CHAT, "tell me slowly")
        wait_for(
            lambda: (
                slow.hits == 1 and any(c.chat_id == CHAT and c.method == "editMessageText" for c in fake.sent)
            ),
            60,
            "the CLI to stream and the preview to be edited",
        )
        half = [m["text"] for m in fake.bot_messages(CHAT)]
        first.kill()
        second = Proc("processor", home, env, tmp_path / "processor2.log")
        wait_for(lambda: answered(fake), 60, "the re-run's whole reply in the chat")
        # Within 10 s of the answer the chat holds it alone (at once, here: the answer is the old preview).
        wait_for(
            lambda: [m["text"] for m in fake.bot_messages(CHAT)] == [REPLY],
            10,
            "the answer alone in the chat",
        )
        time.sleep(1.5)  # nothing may touch the answer afterwards
        rt = open_home(home)
        try:
            leftover = rt.db.read("SELECT key FROM kv WHERE scope = 'preview:telegram'")
        finally:
            rt.close()
    finally:
        adapter.stop()
        if second is not None:
            second.stop()
    record = fake.transcript(CHAT, began)
    print(record)
    assert len(half) == 1 and half[0].endswith(MORE_MARK) and REPLY not in half, record  # killed mid-reply
    assert [m["text"] for m in fake.bot_messages(CHAT)] == [REPLY], record
    sends = [c for c in fake.sent if c.chat_id == CHAT and c.method == "sendMessage"]
    assert len(sends) == 1, record  # one message, from the killed run's first preview to the answer
    assert all(c.text != INTERRUPTED_TEXT for c in fake.sent if c.chat_id == CHAT), record
    assert leftover == [], record


def test_still_working_notes_beside_the_preview_leave_one_answer(
    tmp_path: Path, fake: HoldingTelegram, api: FakeAnthropic
) -> None:
    api.add_rule("tell me slowly", streamed())
    home = claude_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        channels=CHANNELS,
        processor={"progress_note_seconds": 1.0},
    )
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    processor = Proc("processor", home, _env(api, tmp_path), tmp_path / "processor.log")
    began = time.monotonic()
    try:
        fake.push_text(CHAT, "tell me slowly")
        wait_for(lambda: answered(fake), 60, "the whole reply in the chat")
        wait_for(
            lambda: any(m.get("text") == DONE_IN_PREVIEW_TEXT for m in fake.bot_messages(CHAT)),
            10,
            "the note marked done",
        )
        time.sleep(1.5)
    finally:
        adapter.stop()
        processor.stop()
    record = fake.transcript(CHAT, began)
    texts = [m["text"] for m in fake.bot_messages(CHAT)]
    assert sorted(texts) == sorted([REPLY, DONE_IN_PREVIEW_TEXT]), f"{texts}\n{record}"


def test_adapter_killed_mid_stream_continues_the_same_preview_into_the_answer(
    tmp_path: Path, fake: HoldingTelegram, api: FakeAnthropic
) -> None:
    api.add_rule("tell me slowly", Chunked([line + "\n" for line in LINES], interval=0.8))
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=CHANNELS)
    log = tmp_path / "telegram.log"
    adapter = Proc("telegram", home, telegram_env(fake), log)
    processor = Proc("processor", home, _env(api, tmp_path), tmp_path / "processor.log")
    began = time.monotonic()
    restarted: Proc | None = None
    try:
        fake.push_text(CHAT, "tell me slowly")
        # Killed once the preview is recorded (an edit of it exists): a kill between Telegram accepting the
        # first send and its record leaves that one message behind, like any part whose confirmation is lost.
        wait_for(
            lambda: any(c.chat_id == CHAT and c.method == "editMessageText" for c in fake.sent),
            60,
            "the preview edited",
        )
        adapter.kill()
        restarted = Proc("telegram", home, telegram_env(fake), log)
        wait_for(lambda: answered(fake), 60, "the whole reply in the chat")
        time.sleep(1.5)
    finally:
        if restarted is not None:
            restarted.stop()
        processor.stop()
    record = fake.transcript(CHAT, began)
    assert [m["text"] for m in fake.bot_messages(CHAT)] == [REPLY], record  # the same message, finished


def test_steer_a_message_sent_mid_reply_is_taken_in_and_answered_in_the_same_reply(
    tmp_path: Path, fake: HoldingTelegram, api: FakeAnthropic
) -> None:
    """``busy_policy = "steer"`` on the channel: the second message, sent while the first reply streams, is
    noted as added, and the chat ends with one answer holding both turns (workers/steer.py)."""
    api.add_rule("tell me slowly", streamed())
    api.add_rule("add a summary", Chunked(["Summary: ", "all ", "ten ", "lines."], interval=0.8))
    channels = {"telegram": {**CHANNELS["telegram"], "busy_policy": "steer"}}
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels)
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    processor = Proc("processor", home, _env(api, tmp_path), tmp_path / "processor.log")
    began = time.monotonic()
    whole = f"(Answering your 2 messages together.)\n{REPLY}\n\nSummary: all ten lines."
    try:
        fake.push_text(CHAT, "tell me slowly")
        wait_for(lambda: first_seen(fake, LINES[1]) is not None, 60, "the reply to stream into the chat")
        fake.push_text(CHAT, "and add a summary")
        wait_for(
            lambda: any(m.get("text") == whole for m in fake.bot_messages(CHAT)), 60, "the one answer to both"
        )
        time.sleep(1.5)  # nothing may touch the answer afterwards
        rt = open_home(home)
        try:
            runs = rt.db.read_scalar("SELECT COUNT(*) FROM events WHERE type = 'chain_step_start'")
        finally:
            rt.close()
    finally:
        adapter.stop()
        processor.stop()
    record = fake.transcript(CHAT, began)
    print(record)
    texts = [m["text"] for m in fake.bot_messages(CHAT)]
    assert texts.count(whole) == 1 and runs == 1, record
    notes = [t for t in texts if t != whole]
    assert len(notes) == 1 and notes[0].startswith("Added to what “coder” is working on now"), record
    assert first_seen(fake, "Added to what") < first_seen(fake, LINES[-1]), record  # told while it works
    # While the second turn is written the preview keeps the first turn's answer above it.
    summaries = [c.text or "" for c in fake.sent if c.chat_id == CHAT and "Summary:" in (c.text or "")]
    assert len(summaries) >= 2 and all(LINES[-1] in t for t in summaries), record


def test_previews_show_tags_as_the_final_does_never_raw_or_half_written(
    tmp_path: Path, fake: HoldingTelegram, api: FakeAnthropic
) -> None:
    """The reply streams a send_file tag and a handoff tag, each written over several deltas: every preview
    the chat receives shows the text as the final will (the handoff as "→ @mate: …", the send_file tag
    gone), and a tag still being written is left out until it is closed."""
    parts = [
        "Here are the notes you asked for.\n",
        "[send_",
        "file: notes",
        ".txt]\n",
        "I will ask a teammate too:\n",
        "[@ma",
        "te: please check",
        " line 3 of the notes",
        "]\n",
        "That is all for now.\n",
        "Thank you.",
    ]
    api.add_rule("send the notes", Chunked(parts, interval=0.6))
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=CHANNELS)
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    processor = Proc("processor", home, _env(api, tmp_path), tmp_path / "processor.log")
    began = time.monotonic()
    try:
        fake.push_text(CHAT, "send the notes")
        wait_for(
            lambda: any("Thank you." in m.get("text", "") for m in fake.bot_messages(CHAT)), 60, "the reply"
        )
        time.sleep(1.5)  # nothing may touch the answer afterwards
    finally:
        adapter.stop()
        processor.stop()
    record = fake.transcript(CHAT, began)
    print(record)
    shown = [
        c.text or ""
        for c in fake.sent
        if c.chat_id == CHAT and c.method in ("sendMessage", "editMessageText")
    ]
    live = [t for t in shown if t.endswith(MORE_MARK)]
    assert len(live) >= 3, record  # previews while the tags were being written
    assert all("[" not in t and "]" not in t for t in live), record  # no raw tag, no half-written one
    assert any("→ @mate: please check line 3 of the notes" in t for t in live), record
    (final,) = [m["text"] for m in fake.bot_messages(CHAT)]
    assert final.startswith(
        "Here are the notes you asked for.\nI will ask a teammate too:\n→ @mate: please check line 3 of the "
        "notes\nThat is all for now.\nThank you."
    ), record
