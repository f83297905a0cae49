"""The processor's half of live previews (workers/previews.py, the claude provider's text deltas): a real
processor runs the real Claude CLI against the fake API streaming a reply; a thread watches the database.
The partial text grows, is written at most every half second, and is gone once the final reply is queued."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from shared.chat import previews
from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.fakes.anthropic_api import Chunked, FakeAnthropic, Text
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env, of_kind, run_with
from tests.processor_support import open_home
from workers.previews import WRITE_SECONDS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

LINES = [f"Part {i} of the streamed answer." for i in range(1, 9)]
REPLY = " ".join(LINES)


def _watch(rt: Runtime, channel: str, seen: list[previews.Partial]) -> None:
    """Record every distinct partial text of ``channel`` until the final reply is queued."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for row in previews.partials(rt.db, channel):
            if not seen or (row.text, row.updated_at) != (seen[-1].text, seen[-1].updated_at):
                seen.append(row)
        if of_kind(rt, "final"):
            return
        time.sleep(0.02)
    raise AssertionError("no final reply within 60 s")


def _home(tmp_path: Path, channels: dict[str, dict[str, object]] | None = None) -> Runtime:
    return open_home(claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels))


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm-session"])
def test_streamed_text_is_written_coalesced_and_removed_with_the_final(
    tmp_path: Path, api: FakeAnthropic, warm: bool
) -> None:
    api.add_rule("stream it", Chunked([line + " " for line in LINES], interval=0.4))
    processor = {"session_idle_seconds": 60} if warm else None
    with open_home(claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", processor=processor)) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "stream it"
        )
        seen: list[previews.Partial] = []
        run_with(rt, cli_env(api, tmp_path), lambda: _watch(rt, "telegram", seen))
        left = previews.partials(rt.db, "telegram")
        (final,) = of_kind(rt, "final")
    texts = [p.text for p in seen]
    assert len(texts) >= 3, texts  # the reply was visible in the database while it was written
    assert all(REPLY.startswith(t.strip()) for t in texts), texts
    assert all(len(a) < len(b) for a, b in itertools.pairwise(texts)), texts  # it only grows
    # Coalesced: one write per interval at most (a write per delta would be 8 writes 0.4 s apart).
    times = [p.updated_at for p in seen]
    gaps = [(b - a) / 1000 for a, b in itertools.pairwise(times)]
    assert all(g >= WRITE_SECONDS * 0.9 for g in gaps), gaps
    assert {p.conversation for p in seen} == {"c1"}
    assert all(p.edit_key == final["metadata"]["edit_key"] for p in seen)
    assert all(p.message_ids == (sent.message_id,) for p in seen)
    assert final["message"] == REPLY.strip()
    assert left == []  # removed with the final reply


def test_no_preview_where_the_channel_has_it_off(tmp_path: Path, api: FakeAnthropic) -> None:
    api.add_rule("stream it", Chunked([line + " " for line in LINES], interval=0.3))
    with _home(tmp_path, {"telegram": {"preview": False}}) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "stream it"
        )
        rt.queue.intake.enqueue_message(
            ChatAddress("whatsapp", "bo", sender_id="8", conversation="c2"), "stream it"
        )
        seen: list[previews.Partial] = []

        def watch() -> None:
            while len(of_kind(rt, "final")) < 2:
                seen.extend(previews.partials(rt.db, "telegram") + previews.partials(rt.db, "whatsapp"))
                time.sleep(0.02)

        run_with(rt, cli_env(api, tmp_path), watch)
    assert seen == []


def test_a_reply_streamed_in_one_go_writes_no_preview(tmp_path: Path, api: FakeAnthropic) -> None:
    api.add_rule("quick", Text("A quick answer."))
    with _home(tmp_path) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "quick"
        )
        seen: list[previews.Partial] = []

        def watch() -> None:
            while not of_kind(rt, "final"):
                seen.extend(previews.partials(rt.db, "telegram"))
                time.sleep(0.01)

        run_with(rt, cli_env(api, tmp_path), watch)
        writes = rt.db.read_scalar("SELECT COUNT(*) FROM kv WHERE scope = 'preview:telegram'")
    assert seen == [] and writes == 0


def test_the_preview_of_a_long_streamed_reply_stops_at_its_bound(tmp_path: Path, api: FakeAnthropic) -> None:
    # 60 parts of 1,000 characters over about 3 s: past 8,000 characters the preview shows the same start
    # and is written no more, however much the reply grows (each write is the whole text, on the event log).
    parts = [f"{n:04d}" + "z" * 996 for n in range(60)]
    api.add_rule("stream a lot", Chunked(parts, interval=0.05))
    with _home(tmp_path) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="c1"), "stream a lot"
        )
        seen: list[previews.Partial] = []
        run_with(rt, cli_env(api, tmp_path), lambda: _watch(rt, "telegram", seen))
        events = rt.db.read(
            "SELECT payload FROM events WHERE type = 'agent_preview' AND message_id = :m",
            {"m": sent.message_id},
        )
        (final,) = of_kind(rt, "final")
    whole = "".join(parts)
    assert final["message"] == whole
    texts = [p.text for p in seen] + [json.loads(e["payload"])["text"] for e in events]
    assert texts and all(len(t) <= 8000 + 2 for t in texts), [len(t) for t in texts]
    assert all(whole.startswith(t.removesuffix(" …")) for t in texts)
    capped = whole[:8000] + " …"
    assert sum(1 for e in events if json.loads(e["payload"])["text"] == capped) == 1  # then no more writes
