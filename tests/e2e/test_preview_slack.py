"""Live previews on Slack with real processes: ``agentpost run slack`` (Socket Mode) against the fake Slack and
``agentpost run processor`` running the real Claude CLI against the fake Anthropic API, which streams a reply
over about five seconds. The chat sees the reply grow in one message edited by ``chat.update``, and that
message ends as the answer: exactly one final."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.previews import MORE_MARK
from tests.channel_support import Proc, slack_env, wait_for
from tests.fakes.anthropic_api import Chunked, FakeAnthropic
from tests.fakes.slack_api import FakeSlack, message_event
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ANN, DM = "UANN", "D0ANN"
CHANNELS = {"slack": {"allowlist": [ANN], "typing": False}}
LINES = [f"Line {i} of the answer, written slowly." for i in range(1, 11)]
REPLY = "\n".join(LINES)


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    with FakeSlack() as server:
        yield server


def test_reply_grows_by_chat_update_in_one_message_that_becomes_the_answer(
    tmp_path: Path, fake: FakeSlack, api: FakeAnthropic
) -> None:
    api.add_rule("tell me slowly", Chunked([line + "\n" for line in LINES], interval=0.5))
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=CHANNELS)
    env = {**cli_env(api, tmp_path), "PATH": os.environ.get("PATH", "")}
    adapter = Proc("slack", home, slack_env(fake), tmp_path / "slack.log")
    processor = Proc("processor", home, env, tmp_path / "processor.log")
    try:
        adapter.wait_output("Socket Mode connected")
        fake.wait_ack(fake.push_event(message_event(DM, ANN, "tell me slowly")))
        first = fake.wait_sent(lambda s: s.kind == "post" and s.channel == DM, timeout=60)
        wait_for(lambda: fake.shown(DM, first.ts) == REPLY, 60, "the whole reply in the preview's message")
    finally:
        adapter.stop()
        processor.stop()
    posts = [s for s in fake.sent if s.channel == DM and s.kind == "post"]
    updates = [s for s in fake.sent if s.channel == DM and s.kind == "update"]
    assert posts == [first], fake.sent  # one message: the preview, become the answer
    assert first.text.endswith(MORE_MARK) and REPLY not in first.text  # it started as part of the reply
    grown = [len(s.text.removesuffix(MORE_MARK)) for s in updates]
    assert len(updates) >= 3 and grown == sorted(grown), [s.text for s in updates]  # it grew, edit by edit
    assert updates[-1].text == REPLY
    gaps = [b.at - a.at for a, b in itertools.pairwise(updates[:-1])]
    assert all(g >= 0.9 for g in gaps), gaps  # at most one edit a second, the final's own edit aside
