"""The soak's count (bench/soak_tally.py) on hand-made chat records: a reply delivered twice is a repeated
chunk, two runs' replies to one message are a duplicate final, a failed message whose chat was told is not
lost, one that was not told is, and replies are out of order only when a later message was answered first."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from soak_chaos import ApiCall
from soak_tally import Seen, Sent, count, percentile, repeats_per_kill

pytestmark = pytest.mark.unit


def test_repeated_chunk_duplicate_final_told_and_lost_are_told_apart() -> None:
    sent = [
        Sent("lbl-c1-m1", 1, 0.0),  # answered once, delivered twice (the adapter resent it)
        Sent("lbl-c2-m1", 2, 0.0),  # answered by two runs
        Sent("lbl-c3-m1", 3, 0.0),  # failed for good, and the chat was told
        Sent("lbl-c4-m1", 4, 0.0),  # failed for good, the chat never told
        Sent("lbl-c5-m1", 5, 0.0),  # nothing at all
        Sent("lbl-c6-m1", 6, 0.0),  # a preview interrupted by a kill, then the answer of the re-run
    ]
    seen = [
        Seen(1, "tg:1", "answered lbl-c1-m1 (r1)", 2.0, edit=False),
        Seen(1, "tg:1", "answered lbl-c1-m1 (r1)", 2.5, edit=True),  # an edit in place is no copy
        Seen(1, "tg:2", "answered lbl-c1-m1 (r1)", 9.0, edit=False),
        Seen(2, "dc:7", "answered lbl-c2-m1 (r2)", 3.0, edit=False),
        Seen(2, "dc:8", "answered lbl-c2-m1 (r5)", 8.0, edit=False),
        # A killed run's preview, edited to say it was interrupted, and the re-run's answer: one final.
        Seen(6, "dc:9", "answered lbl-c6-m1 (r3)", 2.0, edit=False),
        Seen(
            6,
            "dc:9",
            "(This answer was interrupted before it was finished — the full answer follows.)",
            4.0,
            True,
        ),
        Seen(6, "dc:10", "answered", 5.0, edit=False),
        Seen(6, "dc:10", "answered lbl-c6-m1 (r4)", 6.0, edit=True),
        Seen(3, "tg:3", "Sorry — “a1” could not answer your message after 6 tries: … (ref x)", 4.0, False),
    ]
    calls = [ApiCall(1, 1.0, ("lbl-c1-m1",), 200, 0.5), ApiCall(2, 1.0, ("lbl-c2-m1",), 200, 1.0)]
    tally = count(sent, seen, calls, dead_labels={"lbl-c3-m1", "lbl-c4-m1"})
    assert tally.answered == 3 and tally.finals_received == 4
    assert tally.duplicate_finals == ["lbl-c2-m1"]
    assert [(r["chat"], r["serial"], r["copies"]) for r in tally.repeated_chunks] == [(1, 1, 2)]
    assert tally.told == ["lbl-c3-m1"]
    assert tally.lost == ["lbl-c4-m1", "lbl-c5-m1"]
    # Overhead: the first final's time from the send, minus the model's own time for that message.
    assert tally.latency_ms == [2000.0, 3000.0, 6000.0]
    assert tally.overhead_ms == [1500.0, 2000.0, 6000.0]
    per_kill = repeats_per_kill(tally.repeated_chunks, {"telegram": [1.0, 5.0]}, lambda chat: "telegram")
    assert per_kill["telegram"]["per_kill"] == [0, 1]


def test_out_of_order_counts_a_later_message_answered_first_but_not_one_batch() -> None:
    sent = [Sent("lbl-c1-m1", 1, 0.0), Sent("lbl-c1-m2", 1, 1.0), Sent("lbl-c2-m1", 2, 0.0)]
    sent.append(Sent("lbl-c2-m2", 2, 1.0))
    seen = [
        Seen(1, "a", "answered lbl-c1-m2 (r1)", 3.0, False),
        Seen(1, "b", "answered lbl-c1-m1 (r2)", 4.0, False),
        Seen(2, "c", "answered lbl-c2-m1 lbl-c2-m2 (r3)", 3.0, False),  # one reply to both: in order
    ]
    tally = count(sent, seen, [], set())
    assert (tally.out_of_order_chats, tally.out_of_order_pairs) == (1, 1)
    assert tally.lost == [] and tally.duplicate_finals == []


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0 and percentile(values, 0.99) == 99.0
    assert percentile([], 0.5) is None
