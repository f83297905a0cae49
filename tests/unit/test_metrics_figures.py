"""How /metrics reads a run's end event and builds its histograms (shared.reads.metrics)."""

from __future__ import annotations

import pytest

from shared.reads.metrics import RUN_BOUNDS, Buckets, run_outcome

pytestmark = pytest.mark.unit


def test_a_run_end_event_names_one_outcome() -> None:
    assert run_outcome({"ok": True, "duration_ms": 10}) == "completed"
    assert run_outcome({"ok": False, "stopped_by": "stop"}) == "stopped"
    assert run_outcome({"ok": False, "stopped_by": "interrupt"}) == "interrupted"
    assert run_outcome({"ok": False, "stopped_by": "idle", "timed_out": True}) == "timed_out"
    assert run_outcome({"ok": False, "stopped_by": "ceiling"}) == "timed_out"
    assert run_outcome({"ok": False, "error": "exit 1"}) == "failed"


def test_buckets_count_at_or_below_each_bound_and_end_with_inf() -> None:
    b = Buckets((1, 2.5, 5))
    for value in (0.2, 1, 1.1, 7, 2.5):
        b.observe(value)
    assert b.cumulative() == [("1", 2.0), ("2.5", 4.0), ("5", 4.0), ("+Inf", 5.0)]
    assert b.count == 5 and b.total == pytest.approx(11.8)
    assert Buckets(RUN_BOUNDS).cumulative()[-1] == ("+Inf", 0.0)
