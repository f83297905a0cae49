"""The Telegram adapter as a real process (``agentpost run telegram``) against the fake Bot API, with a real
processor running a scripted agent: replies in the right chat, chunked, with files; crash safety both ways,
for a press of a question's button too."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.chunking import split_message, utf16_len
from shared.chat.address import ChatAddress
from shared.queue import approvals
from shared.storage.statuses import ApprovalStatus
from tests.approval_support import ask_for_bash
from tests.channel_support import (
    HoldingTelegram,
    Proc,
    channel_home,
    count,
    open_home,
    run_cli,
    telegram_env,
    wait_for,
)
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

CHANNELS = {
    "telegram": {"allowlist": ["42", "43"], "poll_timeout_seconds": 1, "typing_interval_seconds": 0.5}
}


def test_reply_chunked_and_file_in_the_right_chats(tmp_path: Path, fake: HoldingTelegram) -> None:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS)
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    try:
        fake.push_text(42, "please write long=30 sleep=1")
        fake.push_text(43, "send me file=notes.txt")
        # 30 paragraphs of ~300 characters: three chunks within Telegram's 4096 UTF-16 units.
        wait_for(lambda: any("[end 30]" in t for t in fake.texts(42)), 40, "the long reply in chat 42")
        wait_for(lambda: fake.documents(43), 20, "the document in chat 43")
    finally:
        adapter.stop()
        processor.stop()
    texts = fake.texts(42)
    assert len(texts) == 3, texts
    assert all(utf16_len(t) <= 4096 for t in texts)
    joined = "\n\n".join(texts)
    positions = [joined.index(f"[end {i}]") for i in range(1, 31)]
    assert positions == sorted(positions)  # every paragraph once, in order
    for chunk in texts:  # cuts fall at paragraph breaks
        assert chunk.startswith("Paragraph ") and chunk.rstrip().endswith("]")
    assert fake.documents(43) == [("notes.txt", b"file notes.txt made by alpha\n")]
    assert not fake.documents(42) and all("notes.txt" not in t for t in texts)
    typing = [c for c in fake.sent if c.method == "sendChatAction" and c.chat_id == 42]
    assert typing and typing[0].params["action"] == "typing"


def test_sigkill_mid_reply_resumes_without_duplicates_or_gaps(tmp_path: Path, fake: HoldingTelegram) -> None:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS)
    fake.add_chat(42, username="alice")
    text = "\n\n".join(f"Section {i}: " + "word " * 300 for i in range(1, 7))
    expected = split_message(text.strip(), 4096, length=utf16_len)
    assert len(expected) == 3
    log = tmp_path / "telegram.log"
    adapter = Proc("telegram", home, telegram_env(fake), log)
    rt = open_home(home)
    try:
        fake.hold_send(2)  # the second chunk hangs in flight ...
        rt.queue.responses.enqueue_response(
            ChatAddress("telegram", "alice", sender_id="42", conversation="42"), text
        )
        assert fake.held.wait(20), adapter.output()
        adapter.kill()  # ... and the adapter dies with it
        fake.release()
        assert fake.texts(42) == expected[:1]
        assert count(rt, "SELECT delivered FROM responses") == 1
        restarted = Proc("telegram", home, telegram_env(fake), log)
        try:
            wait_for(
                lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked'") == 1, 30, "ack"
            )
        finally:
            restarted.stop()
    finally:
        rt.close()
    assert fake.texts(42) == expected  # every chunk exactly once, in order


def test_killed_between_fetch_and_enqueue_enqueues_after_restart(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS)
    log = tmp_path / "telegram.log"
    adapter = Proc("telegram", home, telegram_env(fake, AGENTPOST_TEST_PAUSE_AFTER_FETCH="60"), log)
    rt = open_home(home)
    try:
        update = fake.push_text(42, "do not lose me")
        adapter.wait_output("test hook: paused")
        adapter.kill()
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0
        assert fake.confirmed_offset <= update["update_id"]  # Telegram still holds the update
        restarted = Proc("telegram", home, telegram_env(fake), log)
        try:
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 1, 20, "the update enqueued")
            fake.wait_for_offset(update["update_id"] + 1, timeout=10)
        finally:
            restarted.stop()
        rows = rt.db.read("SELECT message, sender_id, conversation, external_id FROM messages")
    finally:
        rt.close()
    assert rows == [
        {"message": "do not lose me", "sender_id": "42", "conversation": "42", "external_id": "42:1"}
    ]


def test_a_press_killed_before_it_was_applied_is_applied_after_restart(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS)
    chat = ChatAddress("telegram", "alice", sender_id="42", conversation="42")
    fake.add_chat(42, username="alice")
    log = tmp_path / "telegram.log"
    adapter = Proc("telegram", home, telegram_env(fake, AGENTPOST_TEST_PAUSE_AFTER_FETCH="60"), log)
    rt = open_home(home)
    try:
        request = ask_for_bash(rt, chat, "", command="make deploy")
        shown = fake.wait_for(lambda c: c.chat_id == 42 and c.keyboard is not None, 30)
        message_id = int(shown.result["message_id"])
        # The question's delivery is recorded before the kill below (else the restart sends it again, which
        # is the delivery's "at most the part in flight", not what this test is about).
        wait_for(
            lambda: approvals.get(rt.db, request.id).shown_id == str(message_id),  # type: ignore[union-attr]
            30,
            "the question's delivery recorded",
        )
        update = fake.push_callback_query(42, message_id, f"{request.id}:allow", user_id=42)
        adapter.wait_output("test hook: paused")
        adapter.kill()  # fetched, not yet applied
        assert approvals.get(rt.db, request.id).status == ApprovalStatus.PENDING  # type: ignore[union-attr]
        assert fake.confirmed_offset <= update["update_id"]  # Telegram still holds the press
        restarted = Proc("telegram", home, telegram_env(fake), log)
        try:
            fake.wait_for_offset(update["update_id"] + 1, timeout=30)
            decided = "✅ Allowed by alice — Bash: make deploy"
            fake.wait_for(lambda c: c.method == "editMessageText" and c.text == decided, 20)
        finally:
            restarted.stop()
        final = approvals.get(rt.db, request.id)
    finally:
        adapter.kill()
        rt.close()
    assert final is not None and (final.status, final.decided_by) == (ApprovalStatus.ALLOWED, "alice")
    assert [a["text"] for a in fake.callback_answers] == [decided]
    assert fake.chat_log(42)[1:] == [("editMessageText", message_id, decided, None)]


def test_missing_token_names_the_variable(tmp_path: Path) -> None:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", CHANNELS)
    result = run_cli(home, "run", "telegram", env={"TELEGRAM_BOT_TOKEN": ""})
    assert result.returncode == 2
    assert "TELEGRAM_BOT_TOKEN" in result.stderr.replace("\n", " ")
    assert "Traceback" not in result.stderr + result.stdout


def test_a_new_user_pairs_is_told_and_gets_the_answer_without_resending(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    import re

    channels = {"telegram": {"poll_timeout_seconds": 1, "typing": False}}
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels)
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    try:
        fake.push_text(77, "what is in the box")
        code_text = wait_for(
            lambda: next((t for t in fake.texts(77) if "pairing code is" in t), None), 30, "a pairing code"
        )
        code = re.search(r"pairing code is (\w{8})", code_text).group(1)  # type: ignore[union-attr]
        approved = run_cli(home, "pairing", "approve", code)
        assert approved.returncode == 0, approved.stderr
        wait_for(lambda: any("alpha got: what is in the box" in t for t in fake.texts(77)), 40, "the answer")
    finally:
        adapter.stop()
        processor.stop()
    texts = fake.texts(77)
    told = texts.index("You're approved — answering your message now.")
    answer = next(i for i, t in enumerate(texts) if "alpha got: what is in the box" in t)
    assert told < answer and sum("alpha got: what is in the box" in t for t in texts) == 1
