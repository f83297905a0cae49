"""The ``steer`` busy policy, the parts without a process: the run's inbox (offer, feed, settle), the notes a
chat reads, and what ``agentpost doctor`` says about agents that cannot take a message mid-run."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from shared.notices import busy_note, steered_note
from shared.queue.core import QueuedMessage
from shared.settings.busy_policy import parse_busy_policy
from shared.settings.model import load_settings
from tests.queued import claimed_message
from workers.doctor import checks
from workers.steer import SteerInbox, echoed_count, steered_prompt

pytestmark = pytest.mark.unit


def test_inbox_feeds_in_order_and_the_run_ends_only_after_every_message_was_taken_in() -> None:
    async def go() -> None:
        inbox = SteerInbox()
        assert inbox.settle(0)  # nothing handed over: the first result is the run's last
        inbox = SteerInbox()
        assert inbox.offer("a") and inbox.offer("b")
        # Offered but not yet written: this result cannot be the last.
        assert not inbox.settle(0)
        assert [await inbox.take(), await inbox.take()] == ["a", "b"]
        assert not inbox.settle(1)  # the CLI echoed one of the two: it has one more to answer
        assert inbox.settle(2) and inbox.closed
        assert not inbox.offer("c")  # too late: it waits for the chat's next run

    anyio.run(go)


def test_inbox_take_waits_for_an_offer() -> None:
    async def go() -> list[str]:
        inbox = SteerInbox()
        got: list[str] = []

        async def feeder() -> None:
            got.append(await inbox.take())

        async with anyio.create_task_group() as tg:
            tg.start_soon(feeder)
            await anyio.sleep(0)
            assert got == []
            inbox.offer("later")
        return got

    assert anyio.run(go) == ["later"]


def test_a_closed_inbox_refuses() -> None:
    inbox = SteerInbox()
    inbox.close()
    assert not inbox.offer("x")


def test_notes_for_steer() -> None:
    assert parse_busy_policy("Steer") == "steer"
    assert steered_note("coder").startswith("Added to what “coder” is working on now")
    # A steer message that cannot join the run going on waits as under collect, and is told so.
    assert busy_note("coder", "steer", same_chat=False) == busy_note("coder", "collect", same_chat=False)


def test_doctor_says_which_agents_cannot_take_a_message_mid_run(tmp_path: Path) -> None:
    text = (
        '[queue]\ndefault_agent = "coder"\n\n[processor]\nbusy_policy = "steer"\n\n[agents.coder]\n'
        'provider = "claude"\n\n[agents.writer]\nprovider = "codex"\n'
    )
    (tmp_path / "settings.toml").write_text(text)
    env = {"PATH": "/usr/bin", "ANTHROPIC_API_KEY": "k", "HOME": str(tmp_path)}
    found = {c.name: c for c in checks(load_settings(tmp_path, env))}
    steer = found["busy policy steer"]
    assert steer.level == "ok" and steer.detail.startswith("writer (codex) cannot take a message while")
    (tmp_path / "settings.toml").write_text(text.replace('busy_policy = "steer"', 'busy_policy = "collect"'))
    assert "busy policy steer" not in {c.name for c in checks(load_settings(tmp_path, env))}


def _msg(n: int, sender: str, sender_id: str, text: str) -> QueuedMessage:
    return claimed_message(n, conversation="group", text=text, sender=sender, sender_id=sender_id)


def test_a_steered_message_names_its_sender_only_when_someone_else_sent_it() -> None:
    running = [_msg(1, "ann", "7", "write the parser")]
    assert steered_prompt([_msg(2, "ann", "7", "and tests")], running) == "and tests"
    assert steered_prompt([_msg(3, "bob", "8", "use pytest")], running) == "[from bob]:\nuse pytest"
    both = steered_prompt([_msg(4, "ann", "7", "one"), _msg(5, "bob", "8", "two")], running)
    assert "from ann" in both and "from bob" in both  # a collected group's numbered form


def test_one_echo_stands_for_every_message_the_cli_took_together() -> None:
    written = ["first: write the parser", "second: and add tests", "third: and docs"]
    assert echoed_count("first: write the parser", written) == 1
    # Messages waiting on the CLI's input at a turn's end come back as one user message.
    assert echoed_count("second: and add tests\nthird: and docs", written[1:]) == 2
    assert echoed_count("first: write the parser\nsecond: and add tests\nthird: and docs", written) == 3
    # A message's own newlines are not a boundary; text the CLI changed still answers the oldest one.
    assert echoed_count("a\nb", ["a\nb", "c"]) == 1
    assert echoed_count("something else", written) == 1
