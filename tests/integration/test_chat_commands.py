"""Chat commands and the sticky default agent through the Telegram adapter in-process: /help, /agent,
/team, /reset (reaches the processor through the sessions table), ``@agent`` alone and ``@default``."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapters.telegram import TelegramChannel
from shared.chat.sessions import get_session, set_session
from tests.channel_support import HoldingTelegram, RunningChannel, channel_home, open_home, wait_for
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_commands_and_sticky_agent(tmp_path: Path, fake: HoldingTelegram) -> None:
    home = channel_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        {"telegram": {"allowlist": ["42", "43"], "poll_timeout_seconds": 1, "typing": False}},
        agents=("alpha", "beta", "gamma"),
        teams={"dev": {"agents": ["beta", "gamma"], "leader": "gamma"}},
    )
    rt = open_home(home)
    # One conversation per chat (the default session scope): the chat's key is "telegram:42".
    set_session(rt.db, "beta", "telegram:42", "session-beta")
    set_session(rt.db, "alpha", "telegram:42", "session-alpha")
    script = [
        "/help",
        "plain one",  # -> alpha (default)
        "/agent beta",
        "plain two",  # -> beta (sticky)
        "@alpha just this once",  # -> alpha (explicit mention wins, once)
        "plain three",  # -> beta
        "/reset",  # resets beta, the sticky agent
        "/agent nosuch",
        "@gamma",  # switch by mention alone
        "plain four",  # -> gamma
        "/team dev",
        "plain five",  # -> dev's leader gamma
        "@default",
        "plain six",  # -> alpha again
    ]
    answers = sum(1 for line in script if line.startswith("/") or line in ("@gamma", "@default"))
    try:
        with RunningChannel(
            TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})
        ):
            for line in script:
                update = fake.push_text(42, line)
                fake.wait_for_offset(update["update_id"] + 1, 10)
            fake.push_text(43, "other chat")  # stickiness is per chat
            wait_for(lambda: len(fake.texts(42)) == answers, 15, "every command answered")
            wait_for(
                lambda: len(rt.db.read("SELECT id FROM messages WHERE conversation = '43'")) == 1, 10, "43"
            )
        routed = [
            (r["message"], r["agent"]) for r in rt.db.read("SELECT message, agent FROM messages ORDER BY id")
        ]
        replies = fake.texts(42)
        beta_session = get_session(rt.db, "beta", "telegram:42")
        alpha_session = get_session(rt.db, "alpha", "telegram:42")
    finally:
        rt.close()
    assert routed == [
        ("plain one", "alpha"),
        ("plain two", "beta"),
        ("@alpha just this once", "alpha"),
        ("plain three", "beta"),
        ("plain four", "gamma"),
        ("plain five", "gamma"),
        ("plain six", "alpha"),
        ("other chat", "alpha"),
    ]
    assert replies[0].startswith("Commands:")
    assert "agent @beta" in replies[1]
    assert "fresh conversation with @beta" in replies[2]
    assert "Unknown agent 'nosuch'" in replies[3]
    assert "agent @gamma" in replies[4] and "team @dev" in replies[5] and "normal routing" in replies[6]
    assert beta_session is None and alpha_session == "session-alpha"  # /reset reached only beta


def test_retry_requeues_this_chats_last_failed_message_within_the_budget(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    home = channel_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        {"telegram": {"allowlist": ["42", "43"], "poll_timeout_seconds": 1, "typing": False}},
        agents=("alpha",),
    )
    rt = open_home(home)
    budget = rt.queue.config.manual_retry_budget
    try:
        with RunningChannel(
            TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})
        ):
            fake.push_text(42, "/retry")
            wait_for(lambda: len(fake.texts(42)) == 1, 10, "the answer to /retry with nothing failed")
            fake.push_text(42, "please fail")
            fake.push_text(43, "other chat fails too")
            wait_for(lambda: len(rt.db.read("SELECT id FROM messages")) == 2, 10, "both queued")
            mine, other = (r["message_id"] for r in rt.db.read("SELECT message_id FROM messages ORDER BY id"))
            for attempt in range(budget + 1):
                _fail_for_good(rt, "alpha")
                fake.push_text(42, "/retry")
                wait_for(
                    lambda n=attempt: len([t for t in fake.texts(42) if not t.startswith("Sorry")]) >= 2 + n,
                    10,
                    f"answer {attempt}",
                )
            replies = [t for t in fake.texts(42) if not t.startswith("Sorry")]
            states = {r["message_id"]: r for r in rt.db.read("SELECT * FROM messages")}
    finally:
        rt.close()
    assert "no failed message" in replies[0]
    assert all(f"ref {mine}" in r for r in replies[1 : budget + 1]), replies
    assert "already tried again as often as allowed" in replies[budget + 1]
    assert states[mine]["manual_retries"] == budget and states[mine]["status"] == "dead"
    assert states[other]["manual_retries"] == 0  # /retry in chat 42 never touches chat 43


def _fail_for_good(rt: object, agent: str) -> None:
    """What the processor does with a permanent error: claim the agent's messages and fail them at once."""
    from shared.runtime import Runtime

    assert isinstance(rt, Runtime)
    claimed: list[object] = []
    # The message may still be on its way in (a lone chat message is claimable as soon as it is queued).
    wait_for(
        lambda: claimed.extend(rt.queue.messages.claim_all_pending_messages(agent, "test-worker")) or claimed,
        10,
        "a claim",
    )
    ids = [m.message_id for m in rt.queue.admin.list_processing()]
    rt.queue.failures.fail_messages(ids, "test-worker", "refused", permanent=True)
    rt.queue.leases.release_agent(agent, "test-worker")
