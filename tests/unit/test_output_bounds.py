"""The bounds on what a run's output costs while it streams (workers/output_bounds.py), the progress events
of a run (workers/liveness.py) and the live preview's text (shared/chat/previews.py)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from shared.chat.previews import PREVIEW_MAX_CHARS, bounded_preview
from shared.events.log import PendingEvent
from tests.queued import claimed_message
from workers.busy import WorkGroup
from workers.liveness import (
    PROGRESS_MAX_CHARS,
    PROGRESS_MAX_EVENTS,
    PROGRESS_TEXT_CHARS,
    RunInfo,
)
from workers.output_bounds import (
    CUT_MARK,
    STRING_KEEP,
    Line,
    Lines,
    LongJsonLine,
    LongPart,
    PartialText,
    TextSpool,
    save_long_reply,
)

pytestmark = pytest.mark.unit


def _whole(spool: TextSpool) -> str:
    out = io.BytesIO()
    spool.copy_to(out)
    return out.getvalue().decode()


# -- lines -----------------------------------------------------------------------------------------------
def test_lines_are_whole_up_to_the_bound_and_in_parts_beyond() -> None:
    lines = Lines(keep=10)
    assert lines.feed(b"ab\ncd") == [Line(b"ab")]
    assert lines.feed(b"e\n") == [Line(b"cde")]
    assert lines.feed(b"0123456789xx") == [LongPart(b"0123456789xx")]  # past 10 bytes: handed over
    assert lines.buffer == b""  # nothing of it is held
    assert lines.feed(b"yy") == [LongPart(b"yy")]
    assert lines.feed(b"zz\nlast") == [LongPart(b"zz", end=True)]
    assert lines.close() == [Line(b"last", newline=False)]
    assert lines.feed(b"0123456789xx") == [LongPart(b"0123456789xx")]
    assert lines.close() == [LongPart(b"", end=True, newline=False)]


# -- long JSON lines -------------------------------------------------------------------------------------
def _read_long(line: bytes, keys: frozenset[str], step: int) -> LongJsonLine:
    long = LongJsonLine(keys)
    for at in range(0, len(line), step):
        long.feed(line[at : at + step])
    return long


@pytest.mark.parametrize("step", [1, 7, 4096, 65536])
@pytest.mark.parametrize("ascii_only", [True, False])
def test_a_long_json_line_is_made_short_and_its_reply_kept_whole(step: int, ascii_only: bool) -> None:
    # Escapes of every kind, a surrogate pair (ensure_ascii writes 😀 as \ud83d\ude00), raw UTF-8.
    answer = ('Grüße "quoted" \\ back/slash\n\ttab 😀 ' * 3000)[: 3 * STRING_KEEP + 17]
    other = "x" * (STRING_KEEP + 5)
    event = {
        "type": "result",
        "result": answer,
        "note": other,
        "session_id": "s-1",
        "usage": {"input_tokens": 3, "list": ["a", 1, None, True]},
    }
    line = json.dumps(event, ensure_ascii=ascii_only).encode()
    if step == 1 and len(line) > 200_000:
        pytest.skip("too slow byte by byte")
    long = _read_long(line, frozenset({"result"}), step)
    short = json.loads(long.finish())
    assert short["session_id"] == "s-1" and short["usage"] == event["usage"]  # after the long strings
    assert short["result"] == answer[:STRING_KEEP] + CUT_MARK
    assert short["note"] == other[:STRING_KEEP] + CUT_MARK
    cut = long.cuts[short["result"]]
    assert cut.chars == len(answer) and cut.spool is not None
    assert _whole(cut.spool) == answer
    assert long.cuts[short["note"]].spool is None  # not a kept key: counted, not kept
    assert long.cuts[short["note"]].chars == len(other)
    long.close()


def test_a_long_line_that_is_no_json_or_all_shape_is_dropped() -> None:
    assert _read_long(b"plain text " * 200_000, frozenset(), 65536).finish() == ""
    many = json.dumps({"values": list(range(200_000))}).encode()  # short strings, long shape
    assert _read_long(many, frozenset(), 65536).finish() == ""
    unfinished = b'{"result": "' + b"a" * 10_000
    assert _read_long(unfinished, frozenset({"result"}), 4096).finish() == ""


def test_a_long_string_of_escapes_costs_little_memory() -> None:
    import tracemalloc

    line = json.dumps({"result": "\n" * 2_000_000}).encode()  # 4 MB of "\n" escapes
    tracemalloc.start()
    try:
        long = _read_long(line, frozenset({"result"}), 65536)
        short = json.loads(long.finish())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert long.cuts[short["result"]].chars == 2_000_000
    assert peak < 8_000_000, peak  # a backtracking pattern took 120 bytes a character here
    long.close()


# -- texts -----------------------------------------------------------------------------------------------
def test_a_text_stays_in_memory_up_to_its_bound_then_goes_to_a_file(tmp_path: Path) -> None:
    spool = TextSpool(tmp_path, keep=10)
    spool.append("hello ")
    assert not spool.spilled and spool.text() == "hello "
    spool.append("wörld, and more")
    assert spool.spilled and spool.text() == "hello wörl"  # the start only, in memory
    spool.append("!" * 5)
    assert spool.chars == 26 and _whole(spool) == "hello wörld, and more!!!!!"
    assert os.listdir(tmp_path) == []  # the file has no name: nothing to leave behind
    spool.close()
    spool.reset()
    assert spool.chars == 0 and spool.text() == ""


def test_a_text_file_stops_growing_at_its_bound(tmp_path: Path) -> None:
    spool = TextSpool(tmp_path, keep=4, file_max=10)
    spool.append("abcdefgh")
    spool.append("ijklmnop")
    whole = _whole(spool)
    assert whole.startswith("abcdefghij") and "6 more characters, not kept" in whole
    spool.close()


def test_the_preview_text_is_bounded() -> None:
    partial = PartialText(keep=5)
    assert partial.append("abc") and partial.append("de")
    assert partial.shown() == "abcde"
    assert partial.append("f")  # the mark that it goes on
    assert partial.shown() == "abcde …"
    assert not partial.append("more")  # and then nothing shown changes
    assert partial.shown() == "abcde …" and partial.chars == 10
    partial.clear()
    assert not partial and partial.shown() == ""
    assert bounded_preview("x" * (PREVIEW_MAX_CHARS + 1)) == "x" * PREVIEW_MAX_CHARS + " …"
    assert bounded_preview("short") == "short"


# -- replies over the limit ------------------------------------------------------------------------------
def test_a_reply_within_the_limit_is_unchanged(tmp_path: Path) -> None:
    assert save_long_reply("a" * 1000, None, 1000, tmp_path / "r") == ("a" * 1000, None)
    assert not (tmp_path / "r").exists()


def test_a_longer_reply_is_cut_with_a_note_and_saved_whole(tmp_path: Path) -> None:
    text, path = save_long_reply("é" * 1001, None, 1000, tmp_path / "uploads" / "r")
    assert path == tmp_path / "uploads" / "r" / "reply.txt"
    assert path.read_text() == "é" * 1001
    assert text == "é" * 1000 + (
        "\n\n(The reply was 1,001 characters; the first 1,000 are shown and the whole text is attached as "
        "reply.txt.)"
    )
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    spool = TextSpool(tmp_path, keep=2000)
    spool.append("b" * 5000)
    text, path = save_long_reply(spool.text(), spool, 1000, tmp_path / "r2")
    assert path is not None and path.read_text() == "b" * 5000 and text.startswith("b" * 1000 + "\n\n(")
    spool.close()


def test_a_reply_whose_folder_exists_is_not_saved_there(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "r").symlink_to(tmp_path / "elsewhere")
    text, path = save_long_reply("c" * 2000, None, 1000, tmp_path / "r")
    assert path is None and "could not be saved" in text
    assert list((tmp_path / "elsewhere").iterdir()) == []


# -- progress events of a run ----------------------------------------------------------------------------
def _run() -> RunInfo:
    return RunInfo("coder", "run_1", WorkGroup([claimed_message(1, text="hi")], "collect"))


def _progress(run: RunInfo, text: str) -> None:
    payload = {"agent": "coder", "text": text, "message_ids": run.group.ids, "run_id": run.run_id}
    run.add_progress_event(PendingEvent("agent_progress", payload, run.group.ids[0], topic="progress"))


def test_steps_close_together_share_an_event_and_a_run_has_a_bounded_number() -> None:
    run = _run()
    for n in range(200_000):  # a run printing 20 MB as lines of 100 bytes
        _progress(run, f"line {n:06d} " + "x" * 88)
    run.close_progress()
    events = run.take_events()
    texts = [str(e.payload["text"]) for e in events]
    assert len(events) <= PROGRESS_MAX_EVENTS + 1
    assert all(len(t) <= PROGRESS_TEXT_CHARS for t in texts)
    assert sum(len(t) for t in texts[:-1]) <= PROGRESS_MAX_CHARS
    assert texts[0].splitlines()[:2] == ["line 000000 " + "x" * 88, "line 000001 " + "x" * 88]  # joined
    recorded = sum(len(t.splitlines()) for t in texts[:-1])
    assert texts[-1] == f"… {200_000 - recorded:,} more lines not recorded"
    assert events[-1].payload["omitted"] == 200_000 - recorded
    assert {e.payload["run_id"] for e in events} == {"run_1"}


def test_long_steps_each_take_an_event_up_to_the_bound_of_characters() -> None:
    run = _run()
    for _ in range(100):
        _progress(run, "y" * 10_000)  # each cut to one event's length
    run.close_progress()
    texts = [str(e.payload["text"]) for e in run.take_events()]
    kept = PROGRESS_MAX_CHARS // (PROGRESS_TEXT_CHARS + 1)  # each counted with its newline
    assert texts[:-1] == ["y" * PROGRESS_TEXT_CHARS] * kept
    assert texts[-1] == f"… {100 - kept} more lines not recorded"


def test_a_run_within_the_bounds_has_no_marker() -> None:
    run = _run()
    _progress(run, "Bash: npm test")
    _progress(run, "All tests pass.")
    run.close_progress()
    assert [e.payload["text"] for e in run.take_events()] == ["Bash: npm test\nAll tests pass."]


def test_steps_apart_take_an_event_each_up_to_the_bound_of_events() -> None:
    run = _run()
    written = []
    for n in range(1000):
        _progress(run, f"Bash: step {n}")
        written += run.take_events()  # written before the next step arrives: nothing to join
    run.close_progress()
    written += run.take_events()
    assert [e.payload["text"] for e in written] == [
        *(f"Bash: step {n}" for n in range(PROGRESS_MAX_EVENTS)),
        f"… {1000 - PROGRESS_MAX_EVENTS} more lines not recorded",
    ]
