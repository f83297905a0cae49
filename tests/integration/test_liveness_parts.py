"""The parts behind the liveness behaviour, checked directly: reset-time parsing, busy-policy resolution from
the database and settings, merging and capping waiting messages, the status text, the providers' idle
watchdog with a scripted CLI."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from shared.chat.address import ChatAddress
from shared.chat.prefs import get_busy_policy, set_busy_policy
from shared.reads.conversation_status import conversation_status, format_status, record_run
from shared.settings.model import AgentSettings
from tests.liveness_support import claude_home
from tests.processor_support import open_home
from workers.busy import resolve_policy
from workers.providers.base import RunRequest
from workers.providers.registry import provider_for
from workers.ratelimit import parse_reset

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

NOW = int(datetime(2026, 3, 2, 10, 30, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Claude AI usage limit reached|1772450000", 1772450000 * 1000),
        ("429 Too Many Requests; retry-after: 30", NOW + 30_000),
        ("rate limited, try again in 5 minutes", NOW + 300_000),
        ("You've hit your limit · resets 1pm (UTC)", NOW + int(2.5 * 3600 * 1000)),
        ("5-hour limit reached ∙ resets 9am", NOW + int(22.5 * 3600 * 1000)),  # tomorrow: 9am has passed
        ("limit reached, resets at 2026-03-02T12:00:00Z", NOW + int(1.5 * 3600 * 1000)),
        ("API Error: Request rejected (429) · rate limited", None),
        ("resets at 2020-01-01T00:00:00Z", None),  # in the past: not believed
    ],
)
def test_parse_reset_reads_the_stated_reset_time(text: str, expected: int | None) -> None:
    assert parse_reset(text, NOW) == expected


def test_policy_resolution_chat_then_channel_then_processor(tmp_path: Path, sqlite_url: str) -> None:
    home = claude_home(tmp_path, sqlite_url, channels={"discord": {"busy_policy": "interrupt"}})
    with open_home(home) as rt:
        assert (
            resolve_policy(rt.db, rt.settings, "followup", ChatAddress("telegram", conversation="c1"))
            == "followup"
        )
        assert (
            resolve_policy(rt.db, rt.settings, "followup", ChatAddress("discord", conversation="c1"))
            == "interrupt"
        )
        assert set_busy_policy(rt.db, ChatAddress("discord", conversation="c1"), "Collect") == "collect"
        assert get_busy_policy(rt.db, ChatAddress("discord", conversation="c1")) == "collect"
        assert (
            resolve_policy(rt.db, rt.settings, "followup", ChatAddress("discord", conversation="c1"))
            == "collect"
        )
        with pytest.raises(ValueError, match="unknown busy policy"):
            set_busy_policy(rt.db, ChatAddress("discord", conversation="c1"), "sometimes")
        assert set_busy_policy(rt.db, ChatAddress("discord", conversation="c1"), "default") is None
        assert (
            resolve_policy(rt.db, rt.settings, "followup", ChatAddress("discord", conversation="c1"))
            == "interrupt"
        )


def test_status_of_a_chat_with_a_live_run_waiting_messages_and_a_pause(
    tmp_path: Path, sqlite_url: str
) -> None:
    home = claude_home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        first = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "one"
        )
        rt.queue.messages.claim_all_pending_messages("coder", "w1", lease_ms=60_000)
        waiting = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "two"
        )
        assert (
            conversation_status(rt.db, "coder", ChatAddress("telegram", conversation="c1"))["running"]
            is False
        )  # no run record yet
        started = int(time.time() * 1000) - 400_000
        record_run(
            rt.db, "coder", run_id="run_abcdefgh", worker="w1", chat=ChatAddress("telegram", conversation="c1"),
            message_ids=[first.message_id], started_at=started,
        )  # fmt: skip
        rt.queue.control.pause_agent("coder", int(time.time() * 1000) + 600_000, "rate limited")
        status = conversation_status(rt.db, None, ChatAddress("telegram", conversation="c1"))
        assert status["running"] and status["agent"] == "coder" and status["running_since"] == started
        assert status["waiting_ids"] == [waiting.message_id]
        text = format_status(status)
        assert "(6 min)" in text and "1 message waiting." in text and "Paused until" in text
        # A record whose messages are no longer processing (the worker died and they were recovered) is stale.
        with rt.db.transaction() as tx:
            tx.execute("UPDATE messages SET lease_until = 1 WHERE message_id = :m", {"m": first.message_id})
        assert (
            conversation_status(rt.db, "coder", ChatAddress("telegram", conversation="c1"))["running"]
            is False
        )
        assert format_status(
            conversation_status(rt.db, "coder", ChatAddress("telegram", conversation="nobody"))
        ).startswith("Paused")
        rt.queue.control.resume_agent("coder")
        assert format_status(
            conversation_status(rt.db, "coder", ChatAddress("telegram", conversation="nobody"))
        ).startswith("Nothing")


def test_idle_watchdog_kills_a_silent_command_but_not_a_chatty_one(tmp_path: Path) -> None:
    chatty = "import sys, time\nfor i in range(8):\n    print(i, flush=True); time.sleep(0.25)\n"
    silent = "import time\nprint('hello', flush=True)\ntime.sleep(30)\n"

    def run(code: str) -> tuple[bool, str, float]:
        script = tmp_path / "cli.py"
        script.write_text(code)
        settings = AgentSettings(provider="command", command=[sys.executable, str(script)])
        request = RunRequest(
            agent="x", settings=settings, workspace=tmp_path / "ws", prompt="", env={"PATH": "/usr/bin:/bin"},
            timeout=20, idle_timeout=1.0,
        )  # fmt: skip

        async def go() -> tuple[bool, str, float]:
            async def progress(_: str) -> None:
                return None

            started = time.monotonic()
            result = await provider_for("command").run(request, progress)
            return result.ok, result.stopped_by, time.monotonic() - started

        return anyio.run(go)

    ok, stopped_by, elapsed = run(chatty)
    assert ok and stopped_by == "" and elapsed >= 1.5  # two seconds of output every 0.25 s: alive
    ok, stopped_by, elapsed = run(silent)
    assert not ok and stopped_by == "idle" and elapsed < 5
