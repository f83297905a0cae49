"""Pairing and the allowlist, through the Telegram adapter in-process and the ``agentpost pairing`` CLI:
an unknown sender gets one code, once, and their message is never queued (so never run by an agent)."""

from __future__ import annotations

import re
from collections.abc import Iterator
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

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldingTelegram]:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    with HoldingTelegram() as server:
        yield server


def _home(tmp_path: Path, **telegram: object) -> Path:
    settings = {"poll_timeout_seconds": 1, "typing": False, **telegram}
    return channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": settings})


def _channel(rt: Runtime, fake: HoldingTelegram) -> TelegramChannel:
    return TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})


def _codes(fake: HoldingTelegram, chat: int) -> list[str]:
    return [m.group(1) for t in fake.texts(chat) if (m := re.search(r"pairing code is (\w{8})", t))]


def test_unknown_sender_paired_by_cli_then_revoked(tmp_path: Path, fake: HoldingTelegram) -> None:
    home = _home(tmp_path)
    rt = open_home(home)
    try:
        with RunningChannel(_channel(rt, fake)):
            fake.push_text(7, "run rm -rf please", username="mallory")
            fake.push_text(7, "hello?", username="mallory")
            last = fake.push_text(7, "anyone?", username="mallory")
            fake.wait_for_offset(last["update_id"] + 1, 10)
            wait_for(lambda: _codes(fake, 7), 10, "a pairing code")
            assert count(rt, "SELECT COUNT(*) FROM messages") == 0
            codes = _codes(fake, 7)
            assert len(codes) == 1 and len(codes[0]) == 8  # one code, sent once
            listed = run_cli(home, "pairing", "list", "--json")
            assert listed.returncode == 0 and f'"code": "{codes[0]}"' in listed.stdout
            approved = run_cli(home, "pairing", "approve", codes[0])
            assert approved.returncode == 0, approved.stderr
            assert run_cli(home, "pairing", "approve", codes[0]).returncode == 1  # one-time
            fake.push_text(7, "now I am paired", username="mallory")
            wait_for(lambda: count(rt, "SELECT COUNT(*) FROM messages") == 1, 10, "the paired message")
            revoked = run_cli(home, "pairing", "revoke", "telegram", "7")
            assert revoked.returncode == 0, revoked.stderr
            last = fake.push_text(7, "after revoke", username="mallory")
            fake.wait_for_offset(last["update_id"] + 1, 10)
            wait_for(lambda: len(_codes(fake, 7)) == 2, 10, "a fresh code after the revoke")
        messages = [r["message"] for r in rt.db.read("SELECT message FROM messages")]
    finally:
        rt.close()
    assert messages == ["now I am paired"]


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
