"""An overloaded AI service, with the real claude CLI against the fake API answering 529: the chat is told
while the CLI retries inside its run (a progress note, not a final), and an overload that outlasts the run
pauses the agent with a notice that says "overloaded", never "usage limit"."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from tests.fakes.anthropic_api import FakeAnthropic, Overloaded
from tests.fakes.claude_env import claude_env
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.homes import open_home
from tests.liveness_support import claude_home, of_kind, responses
from tests.processor_support import run_idle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

OVERLOADED_NOTE = "Anthropic's servers are overloaded (this is not a usage limit) — trying again in "


def retrying_env(api: FakeAnthropic, tmp: Path, retries: int) -> dict[str, str]:
    home = tmp / "user-home"
    home.mkdir(exist_ok=True)
    return claude_env(api.base_url, home, max_retries=retries)


def test_the_chat_hears_of_an_overload_while_the_cli_retries_and_then_gets_its_answer(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    overload = api.add_rule(None, Overloaded(), times=3)  # the 4th request is answered "OK"
    home = claude_home(tmp_path, sqlite_url)
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "hello"
        )
        stats = run_idle(rt, env=retrying_env(api, tmp_path, retries=5))
        assert overload.hits == 3 and stats.completed == 1 and stats.rate_limited == 0
        notes, (final,) = of_kind(rt, "progress"), of_kind(rt, "final")
        assert notes and all(n["message"].startswith(OVERLOADED_NOTE) for n in notes), notes
        assert "(retry 2 of 5)" in notes[0]["message"]
        assert final["message"] == "OK"
        # Notes of the run: sent before its answer, to the same chat, editable into one message.
        assert [r["id"] for r in responses(rt)][-1] == final["id"]
        assert {n["metadata"]["edit_key"] for n in notes} == {final["metadata"]["edit_key"]}
        assert all((n["conversation"], n["sender_id"]) == ("c1", "7") for n in notes)
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "completed" and msg.retry_count == 0


def test_an_overload_that_outlasts_the_run_pauses_the_agent_in_the_right_words(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    overload = api.add_rule(None, Overloaded(), times=2)  # the whole first run (1 + 1 retry), then "OK"
    home = claude_home(tmp_path, sqlite_url, queue={"max_retries": 1})  # one counted failure = dead
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "hello"
        )
        stats = run_idle(rt, env=retrying_env(api, tmp_path, retries=1), include_delayed=True, timeout=60)
        assert overload.hits == 2 and stats.rate_limited == 1
        (paused,) = of_kind(rt, "paused")
        assert paused["message"].startswith("Anthropic's servers are overloaded, so the agent is waiting")
        assert "not a usage limit" in paused["message"] and "has hit" not in paused["message"]
        assert [r["message"] for r in of_kind(rt, "final")] == ["OK"] and not of_kind(rt, "dead_notice")
        msg = rt.queue.admin.get_message(sent.message_id)
        assert msg is not None and msg.status == "completed" and msg.retry_count == 0
