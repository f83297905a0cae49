"""The Discord adapter as a real process (``agentpost run discord``) against the fake REST API and gateway,
with a real processor: DMs and guild mentions answered in the same channel, chunked at 2,000, with files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.channel_support import Proc, channel_home, count, discord_env, open_home, run_cli, wait_for
from tests.fakes.discord_api import FakeDiscord

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

ALICE, BOB = 5001, 5002
DM, GUILD, GUILD_CHANNEL = 7001, 8001, 8101


@pytest.fixture
def fake() -> Iterator[FakeDiscord]:
    with FakeDiscord(heartbeat_interval_ms=5_000) as server:
        yield server


def _messages(fake: FakeDiscord, channel_id: int) -> list[str]:
    return [s.content or "" for s in fake.sent if s.kind == "message" and s.channel_id == channel_id]


def test_dm_and_guild_mention_replies_chunked_with_file(tmp_path: Path, fake: FakeDiscord) -> None:
    channels = {"discord": {"allowlist": [str(ALICE), str(BOB)], "guild_ready_timeout_seconds": 0.1}}
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels)
    adapter = Proc("discord", home, discord_env(fake), tmp_path / "discord.log")
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    rt = open_home(home)
    try:
        adapter.wait_output("discord adapter")
        wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
        fake.push_message(DM, "hi long=12", ALICE, "alice")
        fake.push_message(GUILD_CHANNEL, "no mention here", BOB, "bob", guild_id=GUILD, mentions=[])
        fake.push_message(GUILD_CHANNEL, f"<@{fake.bot_id}> send file=report.txt", BOB, "bob", guild_id=GUILD)
        wait_for(lambda: any("[end 12]" in t for t in _messages(fake, DM)), 40, "the long DM reply")
        wait_for(
            lambda: any(s.attachments for s in fake.sent if s.channel_id == GUILD_CHANNEL), 30, "the file"
        )
        stored = rt.db.read("SELECT message, conversation, sender_id FROM messages ORDER BY id")
    finally:
        rt.close()
        adapter.stop()
        processor.stop()
    dm = _messages(fake, DM)
    assert len(dm) == 2 and all(len(t) <= 2000 for t in dm)  # 12 paragraphs of ~330: two chunks
    joined = "\n\n".join(dm)
    assert [joined.index(f"[end {i}]") for i in range(1, 13)] == sorted(
        joined.index(f"[end {i}]") for i in range(1, 13)
    )
    file_msgs = [s for s in fake.sent if s.channel_id == GUILD_CHANNEL and s.attachments]
    assert [(a.filename, a.data) for a in file_msgs[0].attachments] == [
        ("report.txt", b"file report.txt made by alpha\n")
    ]
    # the guild message without a mention was never queued; the mention was stripped from the other
    assert sorted((r["message"], r["conversation"]) for r in stored) == [
        ("hi long=12", str(DM)),
        ("send file=report.txt", str(GUILD_CHANNEL)),
    ]
    assert not any(s.channel_id == DM and s.attachments for s in fake.sent)


def test_unpaired_discord_sender_gets_a_code_and_is_not_run(tmp_path: Path, fake: FakeDiscord) -> None:
    home = channel_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"discord": {"guild_ready_timeout_seconds": 0.1}}
    )
    adapter = Proc("discord", home, discord_env(fake), tmp_path / "discord.log")
    rt = open_home(home)
    try:
        wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
        fake.push_message(DM, "run this please", ALICE, "alice")
        fake.push_message(DM, "and this", ALICE, "alice")
        # The two messages are handled side by side, so the reminder of the second may be sent before the
        # code given to the first: wait for the code itself.
        reply = fake.wait_for(lambda s: s.kind == "message" and "pairing code is " in (s.content or ""), 20)
        code = (reply.content or "").split("pairing code is ")[1][:8]
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0
        approved = run_cli(home, "pairing", "approve", code.lower())
        assert approved.returncode == 0, approved.stderr
        # What they wrote while waiting is answered without a resend, then new messages go straight in.
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 2, 20, "the kept messages queued")
        fake.push_message(DM, "now run this", ALICE, "alice")
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 3, 20, "the paired message queued")
        codes = [s for s in fake.sent if "pairing code is" in (s.content or "")]
        queued = [r["message"] for r in rt.db.read("SELECT message FROM messages ORDER BY id")]
    finally:
        rt.close()
        adapter.stop()
    assert len(codes) == 1  # the code is sent once
    assert queued == ["run this please", "and this", "now run this"]
