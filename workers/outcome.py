"""What one run came to, as a value: :meth:`workers.run.Run.attempt` returns one, and
:meth:`workers.run_outcome.OutcomeWriter.apply` is the one place that writes it.

Before the CLI starts, a run can end three ways: it cannot start (:class:`CannotStart`: the agent is not
configured, its own user cannot be made), it may not run (:class:`Refused`: over a budget, its workspace on
another host), or another worker holds its messages by now (:class:`Superseded`). Once the CLI ran, the run
ended in one of six ways (:func:`classify`): completed with a reply, stopped by ``/stop``, interrupted by a
newer message, a conversation to start afresh or to continue from its end, or failed (a rate limit among
the failures; the writer tells them apart). Each of those carries a :class:`RunEnd`: what a run that started
leaves to write whichever way it ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shared.events.log import PendingEvent, append_events
from shared.queue.core import TxWork
from shared.reads.conversation_status import clear_run_in
from shared.storage.db import Tx
from workers.liveness import RunInfo
from workers.previews import PreviewWriter
from workers.providers.base import RunResult


@dataclass(frozen=True)
class RunEnd:
    """What a run that started leaves to write: its progress events still pending and its end event
    (``done``), its status record, its live preview's text and what it cost (``spent``); ``result`` is what
    the CLI returned (its reply file is closed once the outcome is written: :func:`close`)."""

    run: RunInfo
    result: RunResult
    done: PendingEvent
    preview: PreviewWriter | None
    spent: TxWork | None

    def with_completion(self, tx: Tx) -> None:
        """All of that in the transaction that completes the run: never a reply without its end event,
        never the partial text beside the final one, never the cost counted twice or lost."""
        append_events(tx, [*self.run.pending_events, self.done])
        clear_run_in(tx, self.run.agent, self.run.run_id)
        if self.preview is not None:
            self.preview.clear_in(tx)
        if self.spent is not None:
            self.spent(tx)


@dataclass(frozen=True)
class CannotStart:
    """The run could not start at all; written as a failure (``result.cannot_start``)."""

    result: RunResult


@dataclass(frozen=True)
class Refused:
    """The group may not run: dead at once with one notice (``explanation``, ``advice``); ``error`` is the
    operator's line."""

    error: str
    explanation: str
    advice: str


@dataclass(frozen=True)
class Superseded:
    """The run's start could not be written because another worker holds the messages by now: nothing to
    write, and the agent's lease is gone."""


@dataclass(frozen=True)
class Completed:
    """The CLI answered: the reply, handoffs, the conversation's new session."""

    end: RunEnd
    workspace: Path
    session_key: str


@dataclass(frozen=True)
class Stopped:
    """``/stop`` ended the run: completed with one short "stopped" reply."""

    end: RunEnd


@dataclass(frozen=True)
class Interrupted:
    """A newer message of the chat ended the run: the group waits in front, to run again with it."""

    end: RunEnd


@dataclass(frozen=True)
class StartAfresh:
    """The conversation to continue is not on this host: forget it and run the messages again at once."""

    end: RunEnd
    session_key: str


@dataclass(frozen=True)
class ResumeWholeSession:
    """The conversation's resume point was lost: continue from its end, running the messages again."""

    end: RunEnd
    session_key: str
    session: str


@dataclass(frozen=True)
class Failed:
    """The run failed (a rate limit too): retried with a backoff, or dead at the limit."""

    end: RunEnd
    on_fallback: bool


RunOutcome = (
    CannotStart
    | Refused
    | Superseded
    | Completed
    | Stopped
    | Interrupted
    | StartAfresh
    | ResumeWholeSession
    | Failed
)
Ended = Completed | Stopped | Interrupted | StartAfresh | ResumeWholeSession | Failed


def classify(
    end: RunEnd,
    *,
    workspace: Path,
    session_key: str,
    session: str | None,
    on_fallback: bool,
) -> Ended:
    """What a run whose CLI ran came to. The watch's reason comes first (a stopped run's reply is not
    sent even when the CLI finished), then a missing conversation, then success or failure."""
    reason, result = end.run.reason, end.result
    if reason == "stop":
        return Stopped(end)
    if reason == "interrupt":
        return Interrupted(end)
    if result.ok:
        return Completed(end, workspace, session_key)
    if result.session_missing:
        return StartAfresh(end, session_key)
    if result.resume_point_missing and session is not None:
        return ResumeWholeSession(end, session_key, session)
    return Failed(end, on_fallback)


def close(outcome: RunOutcome) -> None:
    """Close the CLI's result an outcome holds (a reply too long to hold in memory is a file: attached by
    now, or not wanted)."""
    if isinstance(outcome, Completed | Stopped | Interrupted | StartAfresh | ResumeWholeSession | Failed):
        outcome.end.result.close()
