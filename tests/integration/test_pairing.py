"""Pairing and the allowlist, through the Telegram adapter in-process and the ``agentpost pairing`` CLI:
an unknown sender gets one code, once, and their message is never queued (so never run by an agent)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adapters import pairing
from adapters.telegram import TelegramChannel
from shared.runtime import Runtime
from tests.channel_support import (
    HoldingTelegram,
    RunningChannel,
    channel_home,
    count,
    open_home,
    run_cli,
    wait_for,
)
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _home(tmp_path: Path, **telegram: object) -> Path:
    settings = {"poll_timeout_seconds": 1, "typing": False, **telegram}
    return channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": settings})


def _channel(rt: Runtime, fake: HoldingTelegram) -> TelegramChannel:
    return TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})


def _codes(fake: HoldingTelegram, chat: int) -> list[str]:
    return [m.group(1) for t in fake.texts(chat) if (m := re.search(r"pairing code is (\w{8})", t))]


def test_unknown_sender_paired_by_cli_is_answered_without_resending_then_revoked(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    home = _home(tmp_path)
    rt = open_home(home)
    try:
        with RunningChannel(_channel(rt, fake)):
            fake.push_text(7, "run the tests please", username="mallory")
            fake.push_text(7, "hello?", username="mallory")
            last = fake.push_text(7, "anyone?", username="mallory")
            fake.wait_for_offset(last["update_id"] + 1, 10)
            wait_for(lambda: _codes(fake, 7) and len(fake.texts(7)) >= 2, 10, "a code and a reminder")
            assert count(rt, "SELECT COUNT(*) FROM messages") == 0  # nothing runs before approval
            codes = _codes(fake, 7)
            assert len(codes) == 1 and len(codes[0]) == 8  # one code, sent once
            reminders = [t for t in fake.texts(7) if t.startswith("Still waiting")]
            assert len(reminders) == 1 and codes[0] not in reminders[0]  # one reminder, not one per message
            listed = run_cli(home, "pairing", "list", "--json")
            assert listed.returncode == 0 and f'"code": "{codes[0]}"' in listed.stdout
            approved = run_cli(home, "pairing", "approve", codes[0])
            assert approved.returncode == 0, approved.stderr
            assert run_cli(home, "pairing", "approve", codes[0]).returncode == 1  # one-time
            # Told in their chat, and what they wrote while waiting is queued without a resend, in order.
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 3, 10, "the kept messages")
            wait_for(lambda: any("approved" in t for t in fake.texts(7)), 10, "the approval notice")
            fake.push_text(7, "now I am paired", username="mallory")
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 4, 10, "the paired message")
            revoked = run_cli(home, "pairing", "revoke", "telegram", "7")
            assert revoked.returncode == 0, revoked.stderr
            last = fake.push_text(7, "after revoke", username="mallory")
            fake.wait_for_offset(last["update_id"] + 1, 10)
            wait_for(lambda: len(_codes(fake, 7)) == 2, 10, "a fresh code after the revoke")
        messages = [r["message"] for r in rt.db.read("SELECT message FROM messages ORDER BY id")]
        notice = [t for t in fake.texts(7) if "approved" in t]
    finally:
        rt.close()
    assert messages == ["run the tests please", "hello?", "anyone?", "now I am paired"]
    assert notice == ["You're approved — answering your 3 messages now."]


def test_allowlist_skips_pairing_and_pending_codes_are_capped(tmp_path: Path, fake: HoldingTelegram) -> None:
    rt = open_home(_home(tmp_path, allowlist=["42"], pairing_max_pending=3))
    try:
        with RunningChannel(_channel(rt, fake)):
            fake.push_text(42, "trusted")
            for chat in (11, 12, 13, 14):
                last = fake.push_text(chat, "stranger")
            fake.wait_for_offset(last["update_id"] + 1, 10)
            wait_for(
                lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked'") == 3, 10, "3 codes"
            )
        assert [r["message"] for r in rt.db.read("SELECT message FROM messages")] == ["trusted"]
        assert fake.texts(42) == []  # no code for an allowlisted sender
        assert [len(_codes(fake, c)) for c in (11, 12, 13, 14)] == [1, 1, 1, 0]
    finally:
        rt.close()


def test_pairing_disabled_ignores_strangers(tmp_path: Path, fake: HoldingTelegram) -> None:
    rt = open_home(_home(tmp_path, pairing=False))
    try:
        with RunningChannel(_channel(rt, fake)):
            last = fake.push_text(7, "hi")
            fake.wait_for_offset(last["update_id"] + 1, 10)
        assert count(rt, "SELECT COUNT(*) FROM messages") == 0
        assert count(rt, "SELECT COUNT(*) FROM pairings") == 0
        assert fake.texts(7) == []
    finally:
        rt.close()


def test_codes_expire_after_an_hour(tmp_path: Path) -> None:
    rt = open_home(_home(tmp_path))
    try:
        first = pairing.check_sender(rt.db, "telegram", "7", "m", now=1_000_000)
        assert first.decision == "new_code"
        assert pairing.check_sender(rt.db, "telegram", "7", "m", now=1_000_000 + 60_000).decision == "pending"
        late = 1_000_000 + pairing.CODE_TTL_MS + 1
        with pytest.raises(pairing.PairingError, match="expired"):
            pairing.approve(rt.db, first.code, now=late)
        second = pairing.check_sender(rt.db, "telegram", "7", "m", now=late)
        assert second.decision == "new_code" and second.code != first.code
        assert pairing.approve(rt.db, second.code, now=late + 1).status == "approved"
        assert pairing.check_sender(rt.db, "telegram", "7", "m", now=late + 2).decision == "approved"
    finally:
        rt.close()


def test_a_new_pairing_request_is_told_to_the_operator_chat_and_doctor(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    from shared.cli.doctor import check_pairings

    home = _home(tmp_path, operator_chat="99")
    rt = open_home(home)
    fake.add_chat(99)
    try:
        with RunningChannel(_channel(rt, fake)):
            fake.push_text(7, "hi there", username="eve")
            wait_for(lambda: _codes(fake, 7), 10, "a pairing code")
            code = _codes(fake, 7)[0]
            wait_for(lambda: any(code in t for t in fake.texts(99)), 10, "the operator's notice")
        (found,) = check_pairings(rt.settings)
    finally:
        rt.close()
    (notice,) = fake.texts(99)
    assert "New pairing request on telegram" in notice and f"agentpost pairing approve {code}" in notice
    assert found.level == "warn" and code in found.detail and "pairing approve" in found.fix
