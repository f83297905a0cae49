"""One Discord chat's messages and replies keep their order: the real ``agentpost run discord`` process against
the fake REST API and gateway.

- Replies: Discord is slow to create the first of two replies to one chat (the request in flight all that
  time). discord.py sends each request as it is made, and Discord orders messages by when it creates them,
  so two sends in flight at once to one channel could land in either order. The runner's delivery claims
  only the oldest unfinished reply of each chat (:meth:`shared.queue.delivery.Responses.claim_responses_for_channel`)
  and sends its parts one after another, so the second reply is not sent before the first is confirmed.
  Other chats are not held up meanwhile. (This held before the test was written; it fails when the claim's
  head-of-chat condition is removed.)
- Messages: discord.py runs each MESSAGE_CREATE handler as a task of its own; a message whose attachment is
  slow to download was overtaken by the next one of the same chat, which was queued first. The adapter now
  takes one chat's messages in one at a time, in the order they came.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from tests.channel_support import Proc, channel_home, count, discord_env, open_home, wait_for
from tests.fakes.discord_api import FakeDiscord

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

ALICE, BOB = 5001, 5002
#: Two chats: their DM channels with the bot.
ALICE_DM, BOB_DM = 7001, 7002
SLOW_SECONDS = 3.0


@pytest.fixture
def fake() -> Iterator[FakeDiscord]:
    with FakeDiscord(heartbeat_interval_ms=5_000) as server:
        # Discord's own headers: with them discord.py lets several sends to one channel fly at once, so the
        # order comes from our delivery, not from discord.py guessing a limit of 1.
        server.report_rate_limits(limit=5, window=5.0)
        yield server


def _messages(fake: FakeDiscord, channel_id: int) -> list[str]:
    return [s.content or "" for s in fake.sent if s.kind == "message" and s.channel_id == channel_id]


def test_two_replies_to_one_discord_chat_go_out_in_order_when_the_first_is_slow(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    channels = {"discord": {"allowlist": [str(ALICE), str(BOB)], "guild_ready_timeout_seconds": 0.1}}
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels)
    rt = open_home(home)
    adapter = Proc("discord", home, discord_env(fake), tmp_path / "discord.log")
    try:
        wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
        # Each chat writes once, so the fake knows its DM channel and discord.py has learnt the rate limit
        # of sending to it (until then it sends one request at a time by itself, as a new bucket allows).
        for channel, user, name in ((ALICE_DM, ALICE, "alice"), (BOB_DM, BOB, "bob")):
            fake.push_message(channel, "/help", user, name)
            wait_for(
                lambda channel=channel: len(_messages(fake, channel)) == 1, 20, f"the help in {name}'s chat"
            )
        # The replies are then queued as the processor queues them, in one go: two for Alice, one for Bob.
        fake.slow_message("first reply", SLOW_SECONDS)
        for conversation, text in (
            (ALICE_DM, "first reply"),
            (ALICE_DM, "second reply"),
            (BOB_DM, "bob's reply"),
        ):
            rt.queue.responses.enqueue_response(ChatAddress("discord", conversation=str(conversation)), text)
        wait_for(
            lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status <> 'acked'") == 0,
            30,
            "every reply delivered",
        )
    finally:
        rt.close()
        adapter.stop()
    sent = [s for s in fake.sent if s.kind == "message"]
    order = [s.content for s in sent if s.content in ("first reply", "second reply", "bob's reply")]
    # Bob's chat is not held up by Alice's slow reply; Alice's second waits for her first.
    assert order == ["bob's reply", "first reply", "second reply"], order
    assert fake.most_at_once[ALICE_DM] == 1
    first, second = (next(s for s in sent if s.content == text) for text in ("first reply", "second reply"))
    assert second.message_id is not None and first.message_id is not None
    assert second.message_id > first.message_id


def test_messages_of_one_discord_chat_are_taken_in_in_the_order_sent(
    tmp_path: Path, fake: FakeDiscord
) -> None:
    # discord.py hands each message to its own task: the first, whose attachment is slow to download, must
    # still be queued before the second (Telegram takes updates one at a time, so there it always was).
    channels = {"discord": {"allowlist": [str(ALICE), str(BOB)], "guild_ready_timeout_seconds": 0.1}}
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels)
    rt = open_home(home)
    adapter = Proc("discord", home, discord_env(fake), tmp_path / "discord.log")
    try:
        wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
        fake.slow_downloads(SLOW_SECONDS)
        fake.push_message(
            ALICE_DM, "first, with notes", ALICE, "alice", attachments=[("notes.txt", b"n", "text/plain")]
        )
        fake.push_message(ALICE_DM, "second", ALICE, "alice")
        fake.push_message(BOB_DM, "bob meanwhile", BOB, "bob")
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 3, 30, "the three messages queued")
        queued = [
            str(r["message"]).split("\n")[0] for r in rt.db.read("SELECT message FROM messages ORDER BY id")
        ]
    finally:
        rt.close()
        adapter.stop()
    # Bob's chat did not wait for Alice's download; Alice's second message waited for her first.
    assert queued == ["bob meanwhile", "first, with notes", "second"], queued
