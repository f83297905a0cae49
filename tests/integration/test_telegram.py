"""The Telegram adapter in-process against the fake Bot API: groups, Markdown fallback, long replies as a
file, inbound documents, typing, deduplication, and two deliverers on one database (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.platform import Inbound
from adapters.runner import ChannelRunner
from adapters.telegram import TelegramChannel
from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.channel_support import HoldingTelegram, RunningChannel, channel_home, count, open_home, wait_for
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SETTINGS = {"allowlist": ["42", "900"], "poll_timeout_seconds": 1, "typing_interval_seconds": 0.3}


def _channel(rt: Runtime, fake: HoldingTelegram, worker: str | None = None) -> ChannelRunner:
    env = {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}
    return ChannelRunner(TelegramChannel(rt, env=env), worker_id=worker)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": SETTINGS})
    runtime = open_home(home)
    yield runtime
    runtime.close()


def test_groups_need_a_mention_and_documents_are_saved(rt: Runtime, fake: HoldingTelegram) -> None:
    with RunningChannel(_channel(rt, fake)):
        fake.push_text(-100, "just chatting", user_id=900, chat_type="group")
        fake.push_text(-100, "@agentpost_bot what is up", user_id=900, chat_type="group")
        fake.push_document(42, "data.csv", b"a,b\n1,2\n", caption="look at this")
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 2, 10, "two queued messages")
    rows = rt.db.read("SELECT message, conversation, sender_id, external_id FROM messages ORDER BY id")
    assert rows[0] == {
        "message": "what is up",
        "conversation": "-100",
        "sender_id": "900",
        "external_id": "-100:2",
    }
    text = rows[1]["message"]
    assert text.startswith("look at this\n[file: ")
    saved = Path(text.split("[file: ")[1].rstrip("]"))
    assert saved.read_bytes() == b"a,b\n1,2\n" and saved.is_relative_to(rt.settings.home / "files")


def test_markdown_fallback_long_reply_as_file_and_typing(rt: Runtime, fake: HoldingTelegram) -> None:
    fake.add_chat(42, username="alice")
    fake.reject_markdown = True
    with RunningChannel(_channel(rt, fake)):
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "alice", sender_id="42", conversation="42"), "busy"
        )
        fake.wait_for(lambda c: c.method == "sendChatAction" and c.chat_id == 42, 10)
        rt.queue.responses.enqueue_response(
            ChatAddress("telegram", "alice", conversation="42"), "a *broken markdown reply"
        )
        rt.queue.responses.enqueue_response(
            ChatAddress("telegram", "alice", conversation="42"), "\n\n".join(["paragraph " * 300] * 10)
        )
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked'") == 2, 15, "acks")
    texts = [c for c in fake.sent if c.method == "sendMessage"]
    assert [(c.text, c.parse_mode) for c in texts] == [("a *broken markdown reply", None)]
    rejected = [c for c in fake.calls if c.method == "sendMessage" and not c.ok]
    assert rejected and rejected[0].parse_mode == "Markdown"  # tried Markdown first, then plain
    documents = fake.documents(42)
    assert len(documents) == 1 and documents[0][0].endswith(".md")
    assert documents[0][1].decode().count("paragraph") == 3000  # the whole reply, in one file


def test_redelivered_update_is_not_queued_twice(rt: Runtime, fake: HoldingTelegram) -> None:
    channel = _channel(rt, fake)
    message = Inbound(conversation="42", sender_id="42", sender="alice", text="hi", external_id="42:7")
    assert asyncio.run(channel.intake.handle(message)) == "queued"
    assert asyncio.run(channel.intake.handle(message)) == "duplicate"
    assert count(rt, "SELECT COUNT(*) FROM messages") == 1


def test_two_deliverers_never_send_the_same_response(
    tmp_path: Path, fake: HoldingTelegram, db_url: str
) -> None:
    home = channel_home(tmp_path, db_url, {"telegram": {**SETTINGS, "delivery_batch": 2}})
    runtimes = [open_home(home) for _ in range(2)]
    fake.add_chat(42, username="alice")
    try:
        running = [
            RunningChannel(_channel(r, fake, f"w{i}"), deliver_only=True) for i, r in enumerate(runtimes)
        ]
        try:
            for i in range(60):
                runtimes[0].queue.responses.enqueue_response(
                    ChatAddress("telegram", "alice", conversation="42"), f"reply {i}"
                )
            wait_for(
                lambda: count(runtimes[0], "SELECT COUNT(*) FROM responses WHERE status = 'acked'") == 60,
                30,
                "acks",
            )
        finally:
            for r in running:
                r.stop()
        by = {row["claimed_by"] for row in runtimes[0].db.read("SELECT claimed_by FROM responses")}
    finally:
        for r in runtimes:
            r.close()
    assert sorted(fake.texts(42)) == sorted(f"reply {i}" for i in range(60))
    assert by <= {"w0", "w1"}


def test_the_update_offset_is_kept_where_earlier_releases_kept_it(rt: Runtime, fake: HoldingTelegram) -> None:
    # The plugin keeps its offset through the runner (Inbox.saved / saving), under its own kv scope
    # "telegram": an offset an earlier release wrote there is read back, and a new one is written there.
    from shared.storage import kv

    key = f"offset:{fake.token.split(':', 1)[0]}"
    ids = [fake.push_text(42, f"message {n + 1}", user_id=42)["update_id"] for n in range(6)]
    with rt.db.transaction() as tx:  # the first four were taken in before the restart
        kv.put(tx, "telegram", key, str(ids[4]))
    with RunningChannel(_channel(rt, fake)):
        wait_for(lambda: kv.get(rt.db, "telegram", key) == str(ids[5] + 1), 10, "the new offset kept")
        fake.wait_for_offset(ids[5] + 1)
    bodies = [r["message"] for r in rt.db.read("SELECT message FROM messages ORDER BY id")]
    assert "\n".join(bodies).split("\n") == ["message 5", "message 6"]  # one or two rows (debounce)
    assert kv.get(rt.db, "platform_state:telegram", key) is None
