"""Fault injection on delivery: the real ``agentpost run telegram`` against the fake Bot API with slowed sends,
SIGKILLed again and again while a send is in flight, restarted each time.

Several replies of several labelled chunks each are queued directly as responses in three chats. Each round
waits until the fake has seen the N-th send since the (re)start arrive (it is then in flight: every send
takes ``SEND_DELAY`` seconds) and kills the adapter at once. The fake carries out a send whose client has
gone, as Telegram would, so the chunk in flight may have reached the chat although the adapter never learnt
it: that chunk (one per chat with a send in flight) is the only one allowed to be sent again.

Per chat, at the end: every chunk of every reply arrived (nothing lost), in order (a later reply never
overtakes an unfinished earlier one), and repeats are immediate re-sends of the chunk last seen, at most one
per kill. The figures are printed (``pytest -s``) so a run before and after a change can be compared.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from adapters.chunking import split_message, utf16_len
from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.channel_support import (
    HoldingTelegram,
    Proc,
    channel_home,
    count,
    open_home,
    telegram_env,
    wait_for,
)
from tests.fault_support import fresh_pg_database
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

CHATS = (201, 202, 203)
REPLIES_PER_CHAT = 4
CHUNKS_PER_REPLY = 3
SEND_DELAY = 0.4
#: Before each kill, wait for this many sends to arrive after the (re)start (varied, so kills land on first,
#: middle and last chunks, and between replies).
KILL_AFTER_SENDS = (2, 3, 1, 4, 2, 5, 3, 2)


@dataclass
class ChatFigures:
    """What one chat received, measured against what it should have received."""

    expected: list[str]
    received: list[str]
    repeated: int = 0
    out_of_order: int = 0
    lost: int = 0
    problems: list[str] = field(default_factory=list)


def label(reply: int, chunk: int) -> str:
    return f"R{reply}C{chunk}"


def reply_text(reply: int) -> str:
    """A reply whose chunks (at Telegram's 4,096 limit) are exactly its labelled paragraphs."""
    filler = "lorem ipsum dolor sit amet " * 110  # ~3,000 characters: one paragraph per chunk
    return "\n\n".join(f"{label(reply, c)} {filler.strip()}" for c in range(CHUNKS_PER_REPLY))


def measure(expected: list[str], received: list[str]) -> ChatFigures:
    """Repeats, reorderings and losses of one chat's received chunk labels."""
    figures = ChatFigures(expected, received)
    position = {name: i for i, name in enumerate(expected)}
    highest = -1
    for name in received:
        index = position.get(name, -1)
        if index == highest:
            figures.repeated += 1  # the chunk last seen, sent again: the one whose fate was unknown
        elif index < highest:
            figures.repeated += 1
            figures.out_of_order += 1
            figures.problems.append(f"{name} again after {expected[highest]}")
        elif index > highest + 1:
            figures.out_of_order += 1
            figures.problems.append(f"{name} before {expected[highest + 1]}")
            highest = index
        else:
            highest = index
    figures.lost = len(set(expected) - set(received))
    return figures


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'agentpost.db'}"
        return
    with fresh_pg_database() as url:
        yield url


def test_adapter_killed_mid_send_keeps_each_chat_in_order(
    tmp_path: Path, fake: HoldingTelegram, database_url: str
) -> None:
    channels = {
        "telegram": {
            "allowlist": [str(c) for c in CHATS],
            "poll_timeout_seconds": 1,
            "typing": False,
        }
    }
    home = channel_home(
        tmp_path, database_url, channels, queue={"lease_seconds": 1.5, "poll_interval_seconds": 0.5}
    )
    rt = open_home(home)
    for chat in CHATS:
        fake.add_chat(chat)
    fake.send_delay = SEND_DELAY
    expected: dict[int, list[str]] = {}
    for chat in CHATS:
        expected[chat] = []
        for reply in range(REPLIES_PER_CHAT):
            text = reply_text(reply)
            chunks = split_message(text, 4096, length=utf16_len)
            assert [c.split(" ", 1)[0] for c in chunks] == [label(reply, c) for c in range(CHUNKS_PER_REPLY)]
            expected[chat] += [label(reply, c) for c in range(CHUNKS_PER_REPLY)]
            rt.queue.responses.enqueue_response(
                ChatAddress("telegram", "alice", sender_id=str(chat), conversation=str(chat)), text
            )
    log = tmp_path / "telegram.log"
    adapter = Proc("telegram", home, telegram_env(fake), log)
    kills = 0
    try:
        for after in KILL_AFTER_SENDS:
            base = fake.sends_started
            adapter.wait_output("telegram adapter")
            if _all_acked(rt):
                break
            fake.wait_sends_started(base + after, timeout=30)
            adapter.kill()  # the send just counted is in flight (each takes SEND_DELAY)
            kills += 1
            adapter = Proc("telegram", home, telegram_env(fake), log)
        wait_for(lambda: _all_acked(rt), 90, "every reply delivered after the last restart")
    finally:
        with contextlib.suppress(AssertionError):
            adapter.stop()
        output = log.read_text(errors="replace") if log.exists() else ""
        rt_close(rt)
    figures = {chat: measure(expected[chat], _labels(fake, chat)) for chat in CHATS}
    summary = (
        f"kills={kills} repeated={sum(f.repeated for f in figures.values())} "
        f"out_of_order={sum(f.out_of_order for f in figures.values())} "
        f"lost={sum(f.lost for f in figures.values())} "
        + " ".join(f"chat{c}:rep={f.repeated},ooo={f.out_of_order},lost={f.lost}" for c, f in figures.items())
    )
    print(f"\ndelivery fault figures ({database_url.split(':', 1)[0]}): {summary}")
    assert kills >= 6, f"too few kills landed ({kills}): {summary}\n{output[-3000:]}"
    for chat, f in figures.items():
        assert f.lost == 0, (chat, summary, f.received)
        assert f.out_of_order == 0, (chat, summary, f.problems, f.received)
        assert f.repeated <= kills, (chat, summary, f.received)
    # Nothing was recorded as failed: every send succeeded eventually.
    assert "giving up" not in output


def _labels(fake: HoldingTelegram, chat: int) -> list[str]:
    return [text.split(" ", 1)[0] for text in fake.texts(chat)]


def _all_acked(rt: Runtime) -> bool:
    return count(rt, "SELECT COUNT(*) FROM responses WHERE status <> 'acked'") == 0


def rt_close(rt: Runtime) -> None:
    with contextlib.suppress(Exception):
        rt.close()
