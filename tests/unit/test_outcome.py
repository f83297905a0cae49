"""What a run came to, decided from the watch's reason and the CLI's result (workers/outcome.classify):
the reason first, then success, then a missing conversation, then failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.events.log import PendingEvent
from tests.queued import claimed_message
from workers.busy import WorkGroup
from workers.liveness import RunInfo
from workers.outcome import (
    Completed,
    Failed,
    Interrupted,
    ResumeWholeSession,
    RunEnd,
    StartAfresh,
    Stopped,
    classify,
)
from workers.providers.base import RunResult

pytestmark = pytest.mark.unit


def _end(reason: str, result: RunResult) -> RunEnd:
    run = RunInfo("coder", "run_1", WorkGroup([claimed_message(1, conversation="7", text="hi")], "collect"))
    run.reason = reason
    return RunEnd(run, result, PendingEvent("chain_step_done", {}), None, None)


def _classify(reason: str, result: RunResult, session: str | None = "s1") -> object:
    end = _end(reason, result)
    return classify(end, workspace=Path("/w"), session_key="7", session=session, on_fallback=False)


@pytest.mark.parametrize(
    ("reason", "result", "session", "kind"),
    [
        ("", RunResult(ok=True, text="done"), "s1", Completed),
        ("stop", RunResult(ok=True, text="finished anyway"), "s1", Stopped),  # a stopped reply is not sent
        ("interrupt", RunResult(ok=False, error="killed"), "s1", Interrupted),
        ("stop", RunResult(ok=False, session_missing=True), "s1", Stopped),
        ("", RunResult(ok=False, session_missing=True), "s1", StartAfresh),
        ("", RunResult(ok=False, resume_point_missing=True), "s1", ResumeWholeSession),
        ("", RunResult(ok=False, resume_point_missing=True), None, Failed),  # nothing to continue from
        ("", RunResult(ok=False, error="boom", rate_limited=True), "s1", Failed),  # the writer pauses
    ],
)
def test_what_a_run_came_to(reason: str, result: RunResult, session: str | None, kind: type) -> None:
    assert type(_classify(reason, result, session)) is kind


def test_an_outcome_carries_what_the_writer_needs() -> None:
    afresh = _classify("", RunResult(ok=False, session_missing=True))
    assert isinstance(afresh, StartAfresh) and afresh.session_key == "7"
    resumed = _classify("", RunResult(ok=False, resume_point_missing=True), "s9")
    assert isinstance(resumed, ResumeWholeSession) and resumed.session == "s9"
    completed = _classify("", RunResult(ok=True, text="hello"))
    assert isinstance(completed, Completed) and completed.end.result.text == "hello"
