"""The channel runner (adapters/runner.py) with every part real — intake, chat commands, delivery, lifecycle —
over real SQLite, around the in-memory platform of tests/fakes/platform.py: what any platform plugin gets
from the runner without writing it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.platform import Inbound
from adapters.runner import ChannelRunner
from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.channel_support import RunningChannel, channel_home, count, open_home, wait_for
from tests.fakes.platform import FakePlatform, PlatformRefused

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ACKED = "SELECT COUNT(*) FROM responses WHERE status = 'acked'"


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    settings = {"allowlist": ["u1"], "pairing": True, "typing": False, "max_chunks": 50}
    runtime = open_home(channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"fake": settings}))
    yield runtime
    runtime.close()


@pytest.fixture
def platform(rt: Runtime) -> Iterator[FakePlatform]:
    fake = FakePlatform(rt)
    with RunningChannel(ChannelRunner(fake)):
        wait_for(lambda: fake.is_open, 10, "the platform opened")
        yield fake


def _said(platform: FakePlatform, conversation: str) -> str:
    """Everything the chat received, as one text (chunks joined, whitespace normalised)."""
    return " ".join(" ".join(platform.texts(conversation)).split())


def _from_ann(text: str, external_id: str) -> Inbound:
    return Inbound(conversation="c1", sender_id="u1", sender="ann", text=text, external_id=external_id)


def test_a_message_is_taken_in_once_and_its_reply_goes_out_in_chunks(
    rt: Runtime, platform: FakePlatform
) -> None:
    platform.push(_from_ann("hello", "m1"))
    platform.push(_from_ann("hello", "m1"))  # the platform redelivers it
    wait_for(lambda: len(platform.outcomes) == 2, 10, "both deliveries handled")
    reply = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    rt.queue.responses.enqueue_response(ChatAddress("fake", "ann", sender_id="u1", conversation="c1"), reply)
    wait_for(lambda: count(rt, ACKED) == 1, 10, "the reply acked")
    assert platform.outcomes == ["queued", "duplicate"]
    assert count(rt, "SELECT COUNT(*) FROM messages WHERE channel = 'fake'") == 1
    chunks = platform.texts("c1")
    assert len(chunks) >= 2 and all(len(c) <= FakePlatform.limit for c in chunks), chunks
    assert _said(platform, "c1") == reply


def test_a_stranger_gets_a_pairing_code_and_nothing_is_queued(rt: Runtime, platform: FakePlatform) -> None:
    platform.push(Inbound(conversation="c9", sender_id="u9", sender="eve", text="hi", external_id="m9"))
    wait_for(lambda: "pairing code" in _said(platform, "c9"), 10, "the pairing code")
    assert platform.outcomes == ["pairing_code"]
    assert count(rt, "SELECT COUNT(*) FROM messages") == 0


def test_a_command_is_answered_not_queued(rt: Runtime, platform: FakePlatform) -> None:
    platform.push(_from_ann("/help", "m2"))
    wait_for(lambda: _said(platform, "c1").startswith("Commands:"), 10, "the help")
    assert platform.outcomes == ["command"]
    assert count(rt, "SELECT COUNT(*) FROM messages") == 0


def test_a_refused_reply_fails_for_good_and_the_chat_is_told_when_it_writes_again(
    rt: Runtime, platform: FakePlatform
) -> None:
    platform.refusals.append(PlatformRefused("bot blocked", permanent=True))
    rt.queue.responses.enqueue_response(
        ChatAddress("fake", "ann", sender_id="u1", conversation="c1"), "a reply that is lost"
    )
    wait_for(lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'failed'") == 1, 10, "failed")
    assert platform.texts("c1") == []
    platform.push(_from_ann("are you there?", "m3"))
    wait_for(lambda: "could not be delivered" in _said(platform, "c1"), 10, "the notice")
    assert "(Fake: the chat is gone)" in _said(platform, "c1")
    assert platform.outcomes == ["queued"]
