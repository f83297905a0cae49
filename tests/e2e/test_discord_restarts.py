"""Restarts of the Discord adapter as real processes (``agentpost run discord``) against the fake gateway and
REST API, with a real processor: what was sent while it was down is answered once after it restarts, a
kill -9 mid-reply is finished within seconds, pairing codes go by DM, typing costs no channel lookups, and an
unreachable API at start is retried, reported, and then used."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from shared.runtime import Runtime
from tests.channel_support import (
    Proc,
    channel_home,
    count,
    discord_env,
    free_port,
    open_home,
    run_cli,
    wait_for,
)
from tests.fakes.discord_api import FakeDiscord

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ALICE, BOB, CAROL = 5001, 5002, 5003
DM, GUILD, GUILD_CHANNEL = 7001, 8001, 8101
OFFLINE = "arrived while I was offline"


class HoldingDiscord(FakeDiscord):
    """The fake, able to hold the n-th message created in one channel for a while (a slow send in flight,
    so a test can kill the adapter in the middle of a reply)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hold: tuple[int, int, float] | None = None  # (channel id, n-th message, seconds)
        self._created: dict[int, int] = {}

    async def _create_message(self, request: web.Request) -> web.Response:
        channel_id = int(request.match_info["channel_id"])
        self._created[channel_id] = self._created.get(channel_id, 0) + 1
        if self.hold is not None and self.hold[:2] == (channel_id, self._created[channel_id]):
            await asyncio.sleep(self.hold[2])
        return await super()._create_message(request)


@pytest.fixture
def fake() -> Iterator[HoldingDiscord]:
    server = HoldingDiscord(heartbeat_interval_ms=5_000)
    server.start()
    try:
        yield server
    finally:
        server.close()


def _home(tmp_path: Path, discord: dict[str, Any] | None = None, **queue: Any) -> Path:
    channels = {
        "discord": {
            "allowlist": [str(ALICE), str(BOB)],
            "guild_ready_timeout_seconds": 0.1,
            **(discord or {}),
        }
    }
    return channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels, queue=queue or None)


def _texts(fake: FakeDiscord, channel_id: int) -> list[str]:
    return [s.content or "" for s in fake.sent if s.kind == "message" and s.channel_id == channel_id]


def _queued(rt: Runtime) -> list[str]:
    return [str(r["message"]) for r in rt.db.read("SELECT message FROM messages ORDER BY id")]


def _adapter(home: Path, fake: FakeDiscord, tmp_path: Path, n: int) -> Proc:
    proc = Proc("discord", home, discord_env(fake), tmp_path / f"discord-{n}.log")
    identified = fake.identifies
    wait_for(lambda: fake.identifies > identified, 30, f"adapter {n} to identify")
    return proc


def test_a_dm_and_a_guild_mention_sent_while_down_are_answered_once_after_a_restart(
    tmp_path: Path, fake: HoldingDiscord
) -> None:
    # A message handled more than a second after it was sent counts as one that arrived while offline.
    home = _home(tmp_path, {"late_message_seconds": 1.0})
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    rt = open_home(home)
    adapters: list[Proc] = []
    try:
        adapters.append(_adapter(home, fake, tmp_path, 1))
        fake.push_message(DM, "hello before", ALICE, "alice")
        fake.push_message(GUILD_CHANNEL, f"<@{fake.bot_id}> guild before", BOB, "bob", guild_id=GUILD)
        wait_for(lambda: _texts(fake, DM) and _texts(fake, GUILD_CHANNEL), 30, "the first replies")
        # Recorded as delivered too: a kill between sending and recording would repeat a reply (allowed,
        # and tested elsewhere), which is not what this test counts.
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked'") == 2, 10, "acks")
        adapters[0].kill()  # kill -9: nothing is handed over
        fake.push_message(DM, "dm while down", ALICE, "alice")
        fake.push_message(GUILD_CHANNEL, f"<@{fake.bot_id}> guild while down", BOB, "bob", guild_id=GUILD)
        fake.push_message(GUILD_CHANNEL, "chatter without a mention", BOB, "bob", guild_id=GUILD)
        time.sleep(1.5)  # the adapter stays down past late_message_seconds
        adapters.append(_adapter(home, fake, tmp_path, 2))
        wait_for(
            lambda: (
                any("dm while down" in t for t in _texts(fake, DM))
                and any("guild while down" in t for t in _texts(fake, GUILD_CHANNEL))
            ),
            30,
            "the replies to what was sent while the adapter was down",
        )
        # A third start reads the same history again: nothing is taken twice.
        adapters[1].stop()
        adapters.append(_adapter(home, fake, tmp_path, 3))
        wait_for(lambda: "caught up" in adapters[2].output(), 20, "the third adapter's catch-up")
        time.sleep(1.0)  # a wrongly queued duplicate would be claimed and answered by now
        stored = [r["message"] for r in rt.db.read("SELECT message FROM messages ORDER BY id")]
    finally:
        for proc in adapters:
            proc.stop()
        processor.stop()
        rt.close()
    assert sorted(stored) == sorted(["hello before", "guild before", "dm while down", "guild while down"])
    # A chat whose message waits behind another chat's run is told so once per run ("Queued: …"); the
    # answers are what this test counts.
    sent = {chat: _texts(fake, chat) for chat in (DM, GUILD_CHANNEL)}
    notes = {chat: [t for t in texts if t.startswith("Queued: ")] for chat, texts in sent.items()}
    dm, guild = ([t for t in sent[chat] if t not in notes[chat]] for chat in (DM, GUILD_CHANNEL))
    assert len(dm) == 2 and len(guild) == 2, sent
    assert all(len(n) <= 2 for n in notes.values()), notes
    assert OFFLINE not in dm[0] and OFFLINE not in guild[0]
    assert dm[1].startswith("(Your message from") and OFFLINE in dm[1] and "dm while down" in dm[1]
    assert OFFLINE in guild[1] and "guild while down" in guild[1]


@pytest.mark.serial  # a latency bound: load from tests running side by side stretches it
def test_kill_9_mid_reply_sends_the_remaining_parts_within_3_s_of_the_restart(
    tmp_path: Path, fake: HoldingDiscord
) -> None:
    # A 30 s lease: finishing within 3 s proves the successor did not wait it out.
    home = _home(tmp_path, {"max_chunks": 10, "typing": False}, lease_seconds=30.0)
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    rt = open_home(home)
    adapters: list[Proc] = []
    try:
        adapters.append(_adapter(home, fake, tmp_path, 1))
        fake.hold = (DM, 3, 4.0)  # the third part hangs in flight
        fake.push_message(DM, "long=30", ALICE, "alice")
        wait_for(lambda: len(_texts(fake, DM)) == 2, 30, "two parts sent")
        time.sleep(0.3)  # the third part's request is in flight, held by the fake
        parts = _planned_parts(rt)
        assert parts >= 5, parts
        adapters[0].kill()
        fake.hold = None
        restarted = time.monotonic()
        adapters.append(Proc("discord", home, discord_env(fake), tmp_path / "discord-2.log"))
        wait_for(lambda: _has_all_parts(fake), 20, "every part of the reply")
        finished = max(s.at for s in fake.sent if s.kind == "message" and s.channel_id == DM)
        acked = wait_for(
            lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked'"), 10, "the ack"
        )
    finally:
        for proc in adapters:
            proc.stop()
        processor.stop()
        rt.close()
    took = finished - restarted
    print(f"restart to the last part: {took:.2f} s")
    assert took <= 3.0, f"the remaining parts went out {took:.2f} s after the restart"
    texts = _texts(fake, DM)
    ends = [int(t.rsplit("[end ", 1)[1].split("]")[0]) for t in texts]
    # Every part arrives, in order; at most one (the one in flight at the kill) twice, right after itself.
    assert len(texts) - parts <= 1, texts
    once = list(dict.fromkeys(ends))
    assert len(once) == parts and once == sorted(once), ends
    assert all(a <= b for a, b in itertools.pairwise(ends)), ends
    assert acked == 1


def _planned_parts(rt: Runtime) -> int:
    from adapters.chunking import split_message

    (row,) = rt.db.read("SELECT message FROM responses")
    return len(split_message(str(row["message"]).strip(), 2000))


def _has_all_parts(fake: FakeDiscord) -> bool:
    return any("[end 30]" in t for t in _texts(fake, DM))


def test_a_guild_pairing_code_goes_by_dm_with_a_hint_in_the_channel(
    tmp_path: Path, fake: HoldingDiscord
) -> None:
    home = _home(tmp_path, {"allowlist": []})
    rt = open_home(home)
    adapter = _adapter(home, fake, tmp_path, 1)
    try:
        fake.push_message(GUILD_CHANNEL, f"<@{fake.bot_id}> let me in", CAROL, "carol", guild_id=GUILD)
        coded = fake.wait_for(lambda s: s.kind == "message" and "pairing code" in (s.content or ""), 20)
        hint = fake.wait_for(lambda s: s.kind == "message" and s.channel_id == GUILD_CHANNEL, 20)
        dm = fake.channel(coded.channel_id)
        code = (coded.content or "").split("pairing code is ")[1][:8]
        approved = run_cli(home, "pairing", "approve", code)
        assert approved.returncode == 0, approved.stderr
        fake.push_message(GUILD_CHANNEL, f"<@{fake.bot_id}> now run this", CAROL, "carol", guild_id=GUILD)
        # Her kept first message is taken back in on approval, beside the new one; the two may land within
        # one poll of each other, so wait for the new one and then look at both.
        wait_for(lambda: "now run this" in " ".join(_queued(rt)), 20, "the paired message queued")
        queued = _queued(rt)
    finally:
        adapter.stop()
        rt.close()
    assert dm is not None and dm["type"] == 1 and dm["recipients"][0]["id"] == str(CAROL)  # a DM with her
    assert coded.channel_id != GUILD_CHANNEL
    assert code not in (hint.content or "") and "direct message" in (hint.content or "")
    assert not any(code in t for t in _texts(fake, GUILD_CHANNEL))
    assert len(queued) == 2 and "let me in" in queued[0] and "now run this" in queued[1], queued


def test_a_one_part_reply_with_typing_looks_its_channel_up_at_most_once(
    tmp_path: Path, fake: HoldingDiscord
) -> None:
    home = _home(tmp_path, {"typing_interval_seconds": 0.3})
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    adapter = _adapter(home, fake, tmp_path, 1)
    try:
        fake.push_message(DM, "think sleep=2", ALICE, "alice")
        wait_for(lambda: _texts(fake, DM), 30, "the reply")
    finally:
        adapter.stop()
        processor.stop()
    typing = [s for s in fake.sent if s.kind == "typing" and s.channel_id == DM]
    lookups = [r for r in fake.requests if r.method == "GET" and r.path == f"/api/v10/channels/{DM}"]
    print(f"typing calls: {len(typing)}, GET /channels/{DM}: {len(lookups)}")
    assert len(typing) >= 3  # the typing indicator was refreshed during the run
    assert len(_texts(fake, DM)) == 1 and len(lookups) <= 1


def test_an_unreachable_api_at_start_is_retried_and_reported_then_used(tmp_path: Path) -> None:
    port = free_port()
    home = _home(tmp_path, {"start_retry_base_seconds": 0.2, "start_retry_max_seconds": 1.0})
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    rt = open_home(home)
    env = {
        "DISCORD_BOT_TOKEN": FakeDiscord().token,
        "DISCORD_API_BASE_URL": f"http://127.0.0.1:{port}/api/v10",
        "DISCORD_GATEWAY_URL": f"ws://127.0.0.1:{port}/gateway",
    }
    adapter = Proc("discord", home, env, tmp_path / "discord.log")
    try:
        wait_for(lambda: "try 3)" in adapter.output(), 20, "three tries")
        assert adapter.popen.poll() is None, adapter.output()  # still there, trying
        status = run_cli(home, "status", "--json")
        doctor = run_cli(home, "doctor", "--json")
        with FakeDiscord(heartbeat_interval_ms=5_000, port=port) as fake:
            wait_for(lambda: fake.identifies > 0, 20, "the adapter to connect once the API is up")
            fake.push_message(DM, "are you there", ALICE, "alice")
            wait_for(lambda: _texts(fake, DM), 30, "the reply")
            later = run_cli(home, "status", "--json")
            adapter.stop()
    finally:
        adapter.stop()
        processor.stop()
        rt.close()
    assert "ClientConnectorError" in adapter.output() and "Traceback" not in adapter.output()
    (channel,) = json.loads(status.stdout)["channels"]
    assert channel["channel"] == "discord" and channel["state"] == "retrying" and channel["attempts"] >= 3
    assert "cannot reach the platform" in channel["detail"] and "Cannot connect" in channel["error"]
    found = [c for c in json.loads(doctor.stdout) if c["area"] == "connection"]
    assert found and found[0]["level"] == "fail" and "cannot reach" in found[0]["detail"], found
    (up,) = json.loads(later.stdout)["channels"]
    assert up["state"] == "up" and up["error"] == ""
