"""A reply addressed the way TinyAGI's send-message skill addresses it (``channel`` + ``senderId``, no chat id)
is delivered to that user by agentpost's own channel adapter — real processes: ``agentpost run web``, ``agentpost
run telegram`` against the fake Bot API — and acknowledged only after it was sent."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from shared.settings.api_token import tinyagi_base_url
from tests.channel_support import HoldingTelegram, Proc, channel_home, telegram_env, wait_for
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)
from tests.homes import open_home
from tests.web_support import free_port, token_of, web_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


def test_send_message_skill_reply_reaches_the_telegram_user(tmp_path: Path, fake: HoldingTelegram) -> None:
    channels = {"telegram": {"allowlist": ["4242"], "poll_timeout_seconds": 1}}
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels)
    fake.add_chat(4242, username="ann")
    port = free_port()
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    rt = open_home(home)
    try:
        with web_process(home, port):
            # TinyAGI's send-message skill sends no token: its base URL carries it.
            base = tinyagi_base_url("127.0.0.1", port, token_of(port))
            r = httpx.post(
                f"{base}/api/responses",
                json={
                    "channel": "telegram",
                    "sender": "Ann",
                    "senderId": "4242",
                    "message": "your build is green",
                },
                timeout=10,
            )
            assert r.status_code == 201 and r.json()["ok"] is True, r.text
            response_id = r.json()["response"]["id"]
            wait_for(lambda: "your build is green" in fake.texts(4242), 30, "the reply in Ann's chat")
            wait_for(
                lambda: (
                    rt.db.read_scalar("SELECT status FROM responses WHERE id = :i", {"i": response_id})
                    == "acked"
                ),
                15,
                "the reply acked after it was sent",
            )
    finally:
        rt.close()
        adapter.stop()
