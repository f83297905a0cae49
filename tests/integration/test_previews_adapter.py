"""The channel runner's half of live previews (adapters/previews.py) on Telegram, in-process against the fake
Bot API: the processor's half is played by writing partial texts the way workers/previews.py does. The
preview is one message, never over the limit and never split; the final becomes it (a long one continues
with its further parts); a preview left by a dead run is closed by any later reply about its message."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from adapters.chunking import split_message, utf16_len
from adapters.previews import INTERRUPTED_TEXT, MORE_MARK, TAKE_OVER_SECONDS
from adapters.telegram import TelegramChannel
from scheduler.jobs import prune_previews
from shared.chat import previews
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.runtime import Runtime
from shared.storage import kv
from shared.storage.kv import Scope, scoped
from tests.channel_support import HoldingTelegram, RunningChannel, channel_home, open_home, wait_for
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CHAT = 42
CHAT_ADDRESS = ChatAddress("telegram", "ann", sender_id="42", conversation="42")
SETTINGS = {"telegram": {"allowlist": ["42"], "poll_timeout_seconds": 1, "typing": False}}


def _stream(rt: Runtime, edit_key: str, text: str, message_id: str = "m1") -> None:
    rt.db.run_transaction(
        lambda tx: previews.put_partial(
            tx, ChatAddress("telegram", conversation="42"), edit_key, text, [message_id]
        )
    )


def _final(rt: Runtime, edit_key: str, text: str, message_id: str = "m1") -> None:
    def done(tx: object) -> None:
        previews.clear_partial_in(tx, ChatAddress("telegram", conversation="42"), edit_key)  # type: ignore[arg-type]

    rt.queue.responses.enqueue_response(
        CHAT_ADDRESS, text, metadata={"kind": "final", "edit_key": edit_key}, message_id=message_id, also=done
    )


def _channel(rt: Runtime, fake: HoldingTelegram) -> TelegramChannel:
    return TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})


def test_a_long_reply_previews_its_first_part_only_then_continues(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    fake.add_chat(CHAT)
    long_text = "\n\n".join(f"Section {i}: " + "word " * 300 for i in range(1, 7)).strip()  # three chunks
    expected = split_message(long_text, 4096, length=utf16_len)
    assert len(expected) == 3
    with open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", SETTINGS)) as rt:
        with RunningChannel(_channel(rt, fake)):
            began = time.monotonic()
            _stream(rt, "run-1", long_text[:500])
            wait_for(lambda: fake.bot_messages(CHAT), 10, "the preview")
            _stream(rt, "run-1", long_text)
            wait_for(lambda: any(c.method == "editMessageText" for c in fake.sent), 10, "the preview edited")
            _final(rt, "run-1", long_text)
            wait_for(lambda: len(fake.bot_messages(CHAT)) == 3, 10, "the whole reply")
            time.sleep(1.5)
        record = fake.transcript(CHAT, began)
    shown = [
        c.text or ""
        for c in fake.sent
        if c.chat_id == CHAT and c.method in ("sendMessage", "editMessageText")
    ]
    previews_shown = [t for t in shown if t.endswith(MORE_MARK)]
    assert len(previews_shown) == 2, record
    assert all(utf16_len(t) <= 4096 for t in shown), record  # never over the limit
    assert "Section 3" not in previews_shown[1], record  # the first part only, never split
    assert [m["text"] for m in fake.bot_messages(CHAT)] == expected, (
        record
    )  # one message per part, first = preview


def test_a_reply_about_the_message_closes_a_dead_runs_preview(tmp_path: Path, fake: HoldingTelegram) -> None:
    fake.add_chat(CHAT)
    with open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", SETTINGS)) as rt:
        with RunningChannel(_channel(rt, fake)):
            began = time.monotonic()
            _stream(rt, "run-1", "The answer starts like this")
            wait_for(lambda: fake.bot_messages(CHAT), 10, "the preview")
            # The run died (its text stays behind); the message ends with a notice, not a final.
            rt.queue.responses.enqueue_response(
                CHAT_ADDRESS,
                "I could not answer this message.",
                metadata={"kind": "dead_notice"},
                message_id="m1",
            )
            wait_for(lambda: len(fake.bot_messages(CHAT)) == 2, 10, "the notice")
            time.sleep(1.5)
            left = previews.partials(rt.db, "telegram")
        record = fake.transcript(CHAT, began)
    texts = [m["text"] for m in fake.bot_messages(CHAT)]
    assert texts == [INTERRUPTED_TEXT, "I could not answer this message."], record
    assert left == [], record


def test_a_preview_whose_text_the_scheduler_removed_is_closed_as_interrupted(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    fake.add_chat(CHAT)
    with open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", SETTINGS)) as rt:
        with RunningChannel(_channel(rt, fake)):
            began = time.monotonic()
            _stream(rt, "run-1", "The answer starts like this")
            wait_for(lambda: fake.bot_messages(CHAT), 10, "the preview")
            # The run died and its message "m1" is not processing (no such message here: as if dead-lettered
            # without a notice, or completed by an operator): nothing about it will ever reach the chat.
            assert prune_previews(rt.db) == 1
            wait_for(
                lambda: [m["text"] for m in fake.bot_messages(CHAT)] == [INTERRUPTED_TEXT],
                10,
                "the preview closed as interrupted",
            )
            wait_for(lambda: previews.left(rt.db, "telegram") == [], 10, "the mark forgotten")
            record = previews.shown(rt.db, ChatAddress("telegram", conversation="42"), "run-1")
        transcript = fake.transcript(CHAT, began)
    assert len(fake.bot_messages(CHAT)) == 1, transcript  # edited, not a new message
    assert record is not None and record["done"] and record["text"] == INTERRUPTED_TEXT, transcript


def test_markdown_refused_preview_and_final_fall_back_to_plain_text(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    fake.add_chat(CHAT)
    fake.reject_markdown = True  # as Telegram refuses a half-written reply's unclosed ``` block
    with open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", SETTINGS)) as rt:
        with RunningChannel(_channel(rt, fake)):
            began = time.monotonic()
            _stream(rt, "run-1", "Here is the code:\n```python\nprint(1)")
            wait_for(lambda: fake.bot_messages(CHAT), 10, "the preview")
            _stream(rt, "run-1", "Here is the code:\n```python\nprint(1)\nprint(2)")
            wait_for(lambda: any(c.method == "editMessageText" for c in fake.sent), 10, "the preview edited")
            _final(rt, "run-1", "Here is the code:\n```python\nprint(1)\nprint(2)\n```")
            wait_for(lambda: any(m["text"].endswith("```") for m in fake.bot_messages(CHAT)), 10, "the reply")
            time.sleep(1.5)
        record = fake.transcript(CHAT, began)
    refused = [c for c in fake.calls if c.chat_id == CHAT and not c.ok]
    assert refused and all(c.parse_mode == "Markdown" for c in refused), record  # tried with styling first
    assert [m["text"] for m in fake.bot_messages(CHAT)] == [
        "Here is the code:\n```python\nprint(1)\nprint(2)\n```"
    ], record


def test_a_dead_runs_text_never_shown_is_not_shown_after_the_answer(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    fake.add_chat(CHAT)
    with open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", SETTINGS)) as rt:
        _stream(
            rt, "run-1", "A half answer of a run whose processor died"
        )  # never shown: the adapter was down
        _stream(rt, "run-2", "The answer")
        _final(rt, "run-2", "The answer, whole.")
        began = time.monotonic()
        with RunningChannel(_channel(rt, fake), deliver_only=True):  # the reply first, no previews shown yet
            wait_for(lambda: fake.bot_messages(CHAT), 10, "the reply")
        with RunningChannel(_channel(rt, fake)):  # then the whole runner, previews and all
            time.sleep(2.5)
        left = previews.partials(rt.db, "telegram")
        record = fake.transcript(CHAT, began)
    assert [m["text"] for m in fake.bot_messages(CHAT)] == ["The answer, whole."], record
    assert left == [], record


def test_a_rerun_continues_the_preview_of_the_run_that_died(tmp_path: Path, fake: HoldingTelegram) -> None:
    """A run died half-way (its processor was killed) and its message runs again under another edit key: the
    new run's text grows in the dead run's preview message, which becomes the answer."""
    fake.add_chat(CHAT)
    with open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", SETTINGS)) as rt:
        with RunningChannel(_channel(rt, fake)):
            began = time.monotonic()
            _stream(rt, "run-1", "The answer starts like this")
            wait_for(lambda: fake.bot_messages(CHAT), 10, "the dead run's preview")
            _stream(rt, "run-2", "The answer starts")
            wait_for(
                lambda: [m["text"] for m in fake.bot_messages(CHAT)] == ["The answer starts" + MORE_MARK],
                10,
                "the re-run's text in the same message",
            )
            _stream(rt, "run-2", "The answer starts like that, and goes on")
            wait_for(lambda: len([c for c in fake.sent if c.method == "editMessageText"]) >= 2, 10, "an edit")
            _final(rt, "run-2", "The answer starts like that, and goes on to the end.")
            wait_for(
                lambda: (
                    [m["text"] for m in fake.bot_messages(CHAT)]
                    == ["The answer starts like that, and goes on to the end."]
                ),
                10,
                "the answer in the same message",
            )
            time.sleep(1.5)  # nothing may touch the answer afterwards
            left = previews.partials(rt.db, "telegram")
            dead = previews.shown(rt.db, ChatAddress("telegram", conversation="42"), "run-1")
        record = fake.transcript(CHAT, began)
    assert [c.method for c in fake.sent if c.chat_id == CHAT].count("sendMessage") == 1, record
    assert all(c.text != INTERRUPTED_TEXT for c in fake.sent), record
    assert left == [], record  # the dead run's text went with the take-over
    assert dead is not None and dead["done"] and dead["taken_by"] == "run-2", record


def test_a_rerun_with_no_preview_of_its_own_finishes_the_dead_runs_preview(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    """The re-run answered before any preview of its own was shown: its final edits the dead run's preview."""
    fake.add_chat(CHAT)
    with open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", SETTINGS)) as rt:
        with RunningChannel(_channel(rt, fake)):
            began = time.monotonic()
            _stream(rt, "run-1", "The answer starts like this")
            wait_for(lambda: fake.bot_messages(CHAT), 10, "the dead run's preview")
            _final(rt, "run-2", "The whole answer.")
            wait_for(
                lambda: [m["text"] for m in fake.bot_messages(CHAT)] == ["The whole answer."],
                10,
                "the answer in the dead run's preview message",
            )
            time.sleep(1.5)
            left = previews.partials(rt.db, "telegram")
        record = fake.transcript(CHAT, began)
    assert [c.method for c in fake.sent if c.chat_id == CHAT].count("sendMessage") == 1, record
    assert left == [], record


def test_a_dead_runs_preview_long_untouched_is_closed_and_the_rerun_starts_a_new_message(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    """A dead run's preview last written longer ago than TAKE_OVER_SECONDS is far up the chat: the re-run
    closes it as interrupted and writes below, where the user looks."""
    fake.add_chat(CHAT)
    chat = ChatAddress("telegram", conversation="42")
    with open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", SETTINGS)) as rt:
        with RunningChannel(_channel(rt, fake)):
            began = time.monotonic()
            _stream(rt, "run-1", "The answer starts like this")
            wait_for(lambda: previews.shown(rt.db, chat, "run-1"), 10, "the dead run's preview recorded")
            shown = previews.shown(rt.db, chat, "run-1")
            long_ago = now_ms() - int((TAKE_OVER_SECONDS + 60) * 1000)
            rt.db.run_transaction(
                lambda tx: kv.put(
                    tx,
                    scoped(Scope.PREVIEW_SENT, "telegram"),
                    previews.preview_key("42", "run-1"),
                    json.dumps(shown),
                    long_ago,
                )
            )
            _stream(rt, "run-2", "The answer")
            wait_for(lambda: len(fake.bot_messages(CHAT)) == 2, 10, "the re-run's own preview")
            _final(rt, "run-2", "The answer, whole.")
            wait_for(
                lambda: [m["text"] for m in fake.bot_messages(CHAT)][-1:] == ["The answer, whole."],
                10,
                "answer",
            )
            time.sleep(1.5)
        record = fake.transcript(CHAT, began)
    assert [m["text"] for m in fake.bot_messages(CHAT)] == [INTERRUPTED_TEXT, "The answer, whole."], record
