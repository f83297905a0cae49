"""Liveness on the channel side, in-process against the platform fakes, with the processor's part played
through the real queue API: /status, /stop and /queue reach the database; progress notes are one message
edited in place (Telegram editMessageText, Discord PATCH), kept across an adapter restart; WhatsApp sends a
new note at most once per interval; the final reply is always one new message; typing keeps refreshing."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.discord import DiscordChannel
from adapters.platform import Inbound
from adapters.progress_notes import DONE_TEXT
from adapters.runner import ChannelRunner
from adapters.telegram import TelegramChannel
from adapters.whatsapp import WhatsAppChannel
from shared.chat import health
from shared.chat.address import ChatAddress
from shared.chat.prefs import get_busy_policy
from shared.reads.conversation_status import record_run, update_run_step
from shared.runtime import Runtime
from tests.channel_support import (
    HoldingTelegram,
    RunningChannel,
    channel_home,
    count,
    discord_env,
    free_port,
    open_home,
    wait_for,
    whatsapp_env,
)
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.whatsapp_api import FakeWhatsApp
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TG = {"allowlist": ["42"], "poll_timeout_seconds": 1, "typing_interval_seconds": 0.3}


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": TG})
    runtime = open_home(home)
    yield runtime
    runtime.close()


def _telegram(rt: Runtime, fake: HoldingTelegram) -> TelegramChannel:
    return TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})


def _ask(fake: HoldingTelegram, text: str, timeout: float = 10) -> str:
    """Send ``text`` in chat 42 and return the next message the bot sends there."""
    before = len(fake.texts(42))
    fake.push_text(42, text)
    wait_for(lambda: len(fake.texts(42)) > before, timeout, f"an answer to {text!r}")
    return fake.texts(42)[before]


def _claim_as_processor(rt: Runtime, worker: str = "proc-1") -> list[str]:
    """Play the processor: claim alpha's pending messages and record a run for chat 42."""
    claimed = wait_for(
        lambda: rt.queue.messages.claim_all_pending_messages("alpha", worker), 10, "a claimable message"
    )
    ids = [m.message_id for m in claimed]
    record_run(
        rt.db,
        "alpha",
        run_id="run-1",
        worker=worker,
        chat=ChatAddress("telegram", conversation="42"),
        message_ids=ids,
        started_at=int(time.time() * 1000) - 125_000,
    )
    update_run_step(rt.db, "alpha", "run-1", "Reading the test files", int(time.time() * 1000))
    return ids


def test_status_stop_and_queue_commands(rt: Runtime, fake: HoldingTelegram) -> None:
    with RunningChannel(_telegram(rt, fake)):
        assert "Nothing is running" in _ask(fake, "/status")
        assert "Nothing is running" in _ask(fake, "/stop")
        assert (
            rt.queue.control.agent_state("alpha")["stop_requested"] == ""
        )  # no request left to stop a later run
        fake.push_text(42, "first job")
        ids = _claim_as_processor(rt)
        fake.push_text(42, "while busy")
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 2, 10, "the second message")
        status = _ask(fake, "/status")
        assert rt.queue.control.agent_state("alpha")["stop_requested"] == ""  # /status changes nothing
        stop = _ask(fake, "/stop")
        requested = rt.queue.control.agent_state("alpha")["stop_requested"]
        assert _ask(fake, "/queue followup").startswith("Busy policy set to followup")
        shown = _ask(fake, "/queue")
        bad = _ask(fake, "/queue sometimes")
        help_text = _ask(fake, "/help")
        steer = _ask(fake, "/queue steer")
        _ask(fake, "/queue followup")
    assert "Working on it since" in status and "(2 min) — @alpha" in status
    assert "Last step: Reading the test files" in status and "1 message waiting." in status
    assert stop == "Stopping…" and requested == "telegram:42"
    assert "followup" in shown and "(the default)" not in shown
    assert "Unknown busy policy 'sometimes'" in bad and "collect|followup|interrupt|steer" in bad
    assert steer.startswith("Busy policy set to steer: a new message is handed to the agent while it works")
    assert "/queue [collect|followup|interrupt|steer]" in help_text
    assert all(f"/{name}" in help_text for name in ("status", "stop", "queue"))
    assert get_busy_policy(rt.db, ChatAddress("telegram", conversation="42")) == "followup"
    stop_events = rt.db.read("SELECT payload FROM events WHERE type = 'stop_requested'")
    assert len(stop_events) == 1
    # The policy is in the database: a new adapter (another process, after a restart) sees it.
    fresh = ChannelRunner(_telegram(rt, fake)).commands
    assert "is followup" in fresh.run_command(_inbound(), "queue", "")
    assert "back to the default busy policy, collect" in fresh.run_command(_inbound(), "queue", "default")
    assert get_busy_policy(rt.db, ChatAddress("telegram", conversation="42")) is None
    assert len(ids) == 1


def _inbound() -> Inbound:
    return Inbound(conversation="42", sender_id="42", sender="alice", text="", external_id="")


def test_chat_messages_are_debounced_and_commands_are_not(rt: Runtime, fake: HoldingTelegram) -> None:
    with RunningChannel(_telegram(rt, fake)):
        fake.push_text(42, "one")
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 1, 10, "the message")
        first = rt.db.read("SELECT created_at, available_at FROM messages")[0]
        assert _ask(fake, "/help").startswith("Commands:")  # answered at once, no debounce
        fake.push_text(42, "two")  # the first is still waiting (no processor): a burst
        wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 2, 10, "the second message")
        burst = rt.db.read("SELECT created_at, available_at FROM messages ORDER BY id")
    # A lone message in a quiet chat is available at once.
    assert int(first["available_at"]) == int(first["created_at"])
    # The second message of the chat opens the debounce window: both wait until it closes.
    window = int(burst[1]["available_at"]) - int(burst[1]["created_at"])
    assert window == rt.settings.queue.debounce_ms == 1200
    assert int(burst[0]["available_at"]) == int(burst[1]["available_at"])


def _progress(rt: Runtime, key: str, text: str, *, kind: str = "progress", conversation: str = "42") -> None:
    rt.queue.responses.enqueue_response(
        ChatAddress("telegram", "alice", conversation=conversation),
        text,
        metadata={"kind": kind, "edit_key": key},
    )


def test_telegram_progress_note_is_edited_in_place_across_a_restart(
    rt: Runtime, fake: HoldingTelegram
) -> None:
    fake.add_chat(42, username="alice")
    acked = "SELECT COUNT(*) FROM responses WHERE status = 'acked'"
    with RunningChannel(_telegram(rt, fake), deliver_only=True):
        _progress(rt, "run-7", "Still working — 3 min, last step: reading *files")
        wait_for(lambda: count(rt, acked) == 1, 10, "the first note")
        _progress(rt, "run-7", "Still working — 6 min, last step: running tests")
        wait_for(lambda: count(rt, acked) == 2, 10, "the second note")
    # A new adapter process: the note's message id comes from the database.
    with RunningChannel(_telegram(rt, fake), deliver_only=True):
        _progress(rt, "run-7", "Still working — 9 min, last step: fixing a test")
        wait_for(lambda: count(rt, acked) == 3, 10, "the third note")
        _progress(rt, "run-7", "All done: the tests pass.", kind="final")
        wait_for(lambda: count(rt, acked) == 4, 10, "the final reply")
        wait_for(lambda: any(c.text == DONE_TEXT for c in fake.sent), 10, "the note marked done")
        _progress(rt, "run-7", "Still working — 12 min (late)")  # after the final: dropped
        wait_for(lambda: count(rt, acked) == 5, 10, "the late note")
    sends = [c for c in fake.sent if c.method == "sendMessage" and c.chat_id == 42]
    edits = [c for c in fake.sent if c.method == "editMessageText"]
    assert [c.text for c in sends] == [
        "Still working — 3 min, last step: reading *files",
        "All done: the tests pass.",
    ]
    assert sends[0].parse_mode is None  # notes are plain text: an agent's step need not be Markdown
    note_id = sends[0].result["message_id"]
    assert [(c.params["message_id"], c.text) for c in edits] == [
        (str(note_id), "Still working — 6 min, last step: running tests"),
        (str(note_id), "Still working — 9 min, last step: fixing a test"),
        (str(note_id), DONE_TEXT),
    ]
    stored = fake.message(42, note_id)
    assert stored is not None and stored["text"] == DONE_TEXT


def test_typing_keeps_refreshing_during_a_long_run(rt: Runtime, fake: HoldingTelegram) -> None:
    fake.add_chat(42, username="alice")
    rt.queue.intake.enqueue_message(
        ChatAddress("telegram", "alice", sender_id="42", conversation="42"), "long job"
    )
    claimed = rt.queue.messages.claim_all_pending_messages("alpha", "proc-1", lease_ms=60_000)
    assert len(claimed) == 1
    with RunningChannel(_telegram(rt, fake), deliver_only=False):
        wait_for(
            lambda: len([c for c in fake.sent if c.method == "sendChatAction"]) >= 6, 15, "six typing calls"
        )
        rt.queue.messages.complete_messages([claimed[0].message_id], "proc-1", "done")
        wait_for(lambda: "done" in fake.texts(42), 10, "the reply")
        typed = len([c for c in fake.sent if c.method == "sendChatAction"])
        time.sleep(1.0)  # a quiet second: typing must have stopped with the run
        after = len([c for c in fake.sent if c.method == "sendChatAction"])
    times = [c.at for c in fake.sent if c.method == "sendChatAction"][:6]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 0.3 + 0.5  # refreshed on schedule, not one interval late after each wake-up
    assert after <= typed + 1


def test_a_connected_adapter_keeps_writing_its_health_row_as_a_heartbeat(
    rt: Runtime, fake: HoldingTelegram
) -> None:
    runner = ChannelRunner(_telegram(rt, fake))
    runner.lifecycle.heartbeat_seconds = 0.2
    with RunningChannel(runner):
        first = wait_for(
            lambda: (h := health.read(rt.db, "telegram")) and h.state == "up" and h,
            10,
            "the adapter to connect",
        )
        later = wait_for(
            lambda: (h := health.read(rt.db, "telegram")) and h.updated_at >= first.updated_at + 300 and h,
            10,
            "the heartbeat to write the row again",
        )
        assert later.state == "up" and later.since == first.since and later.running(later.updated_at)
    stopped = health.read(rt.db, "telegram")
    assert stopped is not None and stopped.state == "stopped" and not stopped.running(stopped.updated_at)


DM = 7001
ALICE = 5001


def test_discord_progress_note_is_one_message_edited_in_place(tmp_path: Path) -> None:
    channels = {"discord": {"allowlist": [str(ALICE)], "guild_ready_timeout_seconds": 0.1, "typing": False}}
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels)
    rt = open_home(home)
    acked = "SELECT COUNT(*) FROM responses WHERE status = 'acked'"
    try:
        with FakeDiscord(heartbeat_interval_ms=5_000) as fake:
            with RunningChannel(DiscordChannel(rt, env=discord_env(fake))):
                wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
                fake.push_message(DM, "hello", ALICE, "alice")
                wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 1, 10, "the DM queued")
                for minutes in (3, 6):
                    rt.queue.responses.enqueue_response(
                        ChatAddress("discord", "alice", conversation=str(DM)),
                        f"Still working — {minutes} min",
                        metadata={"kind": "progress", "edit_key": "run-9"},
                    )
                    wait_for(lambda m=minutes: count(rt, acked) == m // 3, 10, f"note at {minutes} min")  # type: ignore[misc]
                rt.queue.responses.enqueue_response(
                    ChatAddress("discord", "alice", conversation=str(DM)),
                    "The answer.",
                    metadata={"kind": "final", "edit_key": "run-9"},
                )
                wait_for(lambda: count(rt, acked) == 3, 10, "the final reply")
                wait_for(lambda: sum(s.kind == "edit" for s in fake.sent) == 2, 10, "the note marked done")
            sent = [(s.kind, s.content) for s in fake.sent if s.channel_id == DM and s.kind != "typing"]
            note_ids = {s.message_id for s in fake.sent if s.content and s.content.startswith("Still")}
    finally:
        rt.close()
    assert sent == [
        ("message", "Still working — 3 min"),
        ("edit", "Still working — 6 min"),
        ("message", "The answer."),
        ("edit", DONE_TEXT),
    ]
    assert len(note_ids) == 1  # the edits went to the note's own message


def test_whatsapp_notes_are_new_messages_at_most_once_per_interval(tmp_path: Path) -> None:
    home = channel_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        {"whatsapp": {"allowlist": ["111"], "typing": False, "progress_min_interval_seconds": 60}},
    )
    rt = open_home(home)
    acked = "SELECT COUNT(*) FROM responses WHERE status = 'acked'"
    try:
        with FakeWhatsApp() as fake:
            env = whatsapp_env(fake, "s", free_port())
            channel = WhatsAppChannel(rt, env=env)
            for n, (kind, text) in enumerate(
                [
                    ("progress", "Still working — 3 min"),
                    ("progress", "Still working — 6 min"),
                    ("final", "Done!"),
                ],
                1,
            ):
                rt.queue.responses.enqueue_response(
                    ChatAddress("whatsapp", "bob", conversation="111"),
                    text,
                    metadata={"kind": kind, "edit_key": "run-3"},
                )
                asyncio.run(_deliver_with_http(channel))
                assert count(rt, acked) == n
            texts = [s.text for s in fake.sent]
    finally:
        rt.close()
    assert texts == ["Still working — 3 min", "Done!"]


async def _deliver_with_http(channel: WhatsAppChannel) -> None:
    import httpx

    channel.http = httpx.AsyncClient(timeout=10)
    try:
        await ChannelRunner(channel).delivery.run_until_idle(10)
    finally:
        await channel.http.aclose()
        channel.http = None
