"""The CLI as a channel: follow one message from the terminal until it is answered.

The CLI has no adapter process: its replies (channel ``cli``) wait in the queue until a terminal reads them —
``agentpost send --wait`` and ``agentpost chat`` while they wait, ``agentpost replies`` later. Reading a reply
acknowledges it, like any channel's delivery. While the agent works, its steps (``agent_progress`` events) and
notes ("still working", "trying again in 8 s") are shown as they come.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from shared.chat.address import ChatAddress
from shared.queue import approvals
from shared.queue.approvals import Choice
from shared.queue.core import QueuedMessage, QueuedResponse
from shared.queue.reports import processor_running
from shared.runtime import Runtime
from shared.storage.statuses import MessageStatus

CLI_CHANNEL = "cli"
#: Reply kinds that are an answer (or the explanation of why there is none), as opposed to a passing note.
NOTE_KINDS = frozenset({"progress"})
#: An agent asking before a tool runs, and what became of the question (:mod:`shared.queue.approvals`).
QUESTION_KINDS = frozenset({"approval", "approval_closed"})
ERROR_KINDS = frozenset({"dead_notice", "failed", "budget_notice"})
#: A message nobody has taken up after this many seconds makes the wait ask whether a processor runs.
NO_PROCESSOR_AFTER = 5.0
#: How often the wait asks again while the message waits (so a processor started later is noticed).
PROCESSOR_CHECK_EVERY = 2.0
#: How long the newest step is held back before it is shown: the agent's last text, which is also its
#: answer, comes as a step a moment before the reply, and is then not shown twice.
STEP_HOLD = 2.0
NO_PROCESSOR = "queued; no processor is running — start it with `agentpost up`"
PROCESSOR_BACK = "a processor is running now; waiting for the reply"


class FollowView(Protocol):
    """Where a followed message's story goes (the terminal printer, in :mod:`shared.cli.talk`)."""

    def step(self, text: str) -> None:
        """A step of the agent's run, or a passing note ("trying again in 8 s")."""

    def preview(self, text: str) -> None:
        """The reply as written so far (a live preview: the whole text each time, growing)."""

    def reply(self, response: QueuedResponse) -> None:
        """A reply to the followed message."""

    def earlier(self, response: QueuedResponse) -> None:
        """A reply to an earlier message of the chat, read while waiting (shown labelled)."""

    def note(self, text: str) -> None:
        """A line about the wait itself (no processor is running)."""

    def question(self, text: str, approval_id: str) -> Choice | None:
        """The agent asks before a tool runs: the person's answer, or None (they answer elsewhere: the
        view says how)."""


@dataclass
class Followed:
    """How a followed message ended, and the replies read for it (already acknowledged)."""

    #: "completed", "dead", "waiting" (the wait ran out first) or "interrupted" (Ctrl-C)
    status: str
    replies: list[QueuedResponse] = field(default_factory=list)
    #: replies to earlier messages of the chat, read (and acknowledged) during the wait
    earlier: list[QueuedResponse] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status == MessageStatus.DEAD or any(
            (r.metadata or {}).get("kind") in ERROR_KINDS for r in self.replies
        )


def read_replies(
    rt: Runtime, conversation: str, show: Callable[[QueuedResponse], None], *, notes: bool = True
) -> list[QueuedResponse]:
    """Show and acknowledge the replies waiting in a CLI chat, oldest first; notes only when ``notes``."""
    shown = []
    for response in rt.queue.admin.chat_responses(ChatAddress(CLI_CHANNEL, conversation=conversation)):
        if notes or (response.metadata or {}).get("kind") not in NOTE_KINDS:
            show(response)
        rt.queue.responses.ack_response(response.id)
        shown.append(response)
    return shown


def first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


class _Follow:
    """The state of one wait: see :func:`follow_message`."""

    def __init__(self, rt: Runtime, message_id: str, view: FollowView, after_cursor: str) -> None:
        self.rt = rt
        self.message_id = message_id
        self.view = view
        self.cursor = after_cursor
        self.outcome = Followed("waiting")
        self.held: tuple[str, float] | None = None  # the newest step, not shown yet, and when it came
        self.no_processor = False
        self.next_check = time.monotonic() + NO_PROCESSOR_AFTER

    def steps(self) -> None:
        for entry in self.rt.events.read("progress", after=self.cursor, limit=500):
            self.cursor = entry.cursor
            text = entry.payload.get("text")
            if entry.type == "agent_preview":  # the answer being written, not a step
                if self.message_id in (entry.payload.get("message_ids") or []) and text:
                    self.view.preview(str(text))
                continue
            if self.message_id in (entry.payload.get("message_ids") or []) and text:
                self.flush()
                self.held = (str(text), time.monotonic())

    def flush(self, answer: str | None = None) -> None:
        """Show the held step, unless it is the first line of ``answer`` (the agent's answer itself)."""
        if self.held is not None:
            step = first_line(self.held[0])
            if answer is None or step not in {ln.strip() for ln in answer.splitlines()}:
                self.view.step(self.held[0])
            self.held = None

    def replies(self, conversation: str, message: QueuedMessage | None) -> None:
        for response in self.rt.queue.admin.chat_responses(
            ChatAddress(CLI_CHANNEL, conversation=conversation)
        ):
            kind = (response.metadata or {}).get("kind")
            if kind in QUESTION_KINDS:
                self.flush()
                self._question(response) if kind == "approval" else self.view.step(response.message)
            elif self._answers(response, message):
                if kind in NOTE_KINDS:
                    self.flush()
                    self.view.step(response.message)
                else:
                    self.flush(response.message)
                    self.view.reply(response)
                    self.outcome.replies.append(response)
            elif kind not in NOTE_KINDS:  # a passing note about another message is over by now
                self.view.earlier(response)
                self.outcome.earlier.append(response)
            self.rt.queue.responses.ack_response(response.id)

    def _question(self, response: QueuedResponse) -> None:
        """Show an agent's question and apply the answer typed (the terminal's user is its sender)."""
        approval_id = str((response.metadata or {}).get("approval_id") or "")
        request = approvals.get(self.rt.db, approval_id)
        if request is None or not request.waiting():
            return  # answered elsewhere or over: what became of it follows
        choice = self.view.question(response.message, approval_id)
        if choice is not None:
            who = response.sender or "you"
            answered = approvals.answer(
                self.rt.db, self.rt.queue.responses, approval_id, choice, by=who, via="cli"
            )
            if answered.outcome != "applied":
                self.view.note(answered.text)

    def _answers(self, response: QueuedResponse, message: QueuedMessage | None) -> bool:
        """Whether ``response`` answers the followed message: its own, or the reply of a run that merged
        it with others (written, with the same time, in the transaction that completed it)."""
        if response.message_id == self.message_id:
            return True
        if message is None or message.status != MessageStatus.COMPLETED:
            message = self.rt.queue.admin.get_message(self.message_id)
        return (
            message is not None
            and message.status == MessageStatus.COMPLETED
            and message.updated_at == response.created_at
        )

    def check_processor(self) -> None:
        now = time.monotonic()
        if now < self.next_check:
            return
        self.next_check = now + PROCESSOR_CHECK_EVERY
        running = processor_running(self.rt.db)
        if running == self.no_processor:
            self.no_processor = not running
            self.view.note(PROCESSOR_BACK if running else NO_PROCESSOR)

    def pause(self, deadline: float) -> float:
        """How long to sleep before looking again (the change signal may wake the wait sooner)."""
        now = time.monotonic()
        until = min(deadline, now + 1.0, self.next_check)
        if self.held is not None:
            until = min(until, self.held[1] + STEP_HOLD)
        return max(0.0, until - now)


def follow_message(
    rt: Runtime,
    message_id: str,
    conversation: str,
    *,
    after_cursor: str,
    timeout: float,
    view: FollowView,
) -> Followed:
    """Wait until ``message_id`` is completed or dead and its replies in the CLI chat are read.

    ``after_cursor`` is the event log's cursor from before the message was queued, so no step is missed.
    Steps and notes of the message go to ``view.step``, its replies to ``view.reply``; replies to other
    messages of the chat that arrive meanwhile (a ``/retry``, a dead letter retried) to ``view.earlier``.
    When the message is still not done after :data:`NO_PROCESSOR_AFTER` seconds and no processor runs,
    ``view.note`` says so once, and again when one starts. Returns ``status = "waiting"`` when ``timeout``
    seconds pass first (the reply then waits for ``agentpost replies``).
    """
    deadline = time.monotonic() + timeout
    follow = _Follow(rt, message_id, view, after_cursor)
    while True:
        generation = rt.waker.generation
        # The status first: a reply is committed with the completion, so once the status says done, the
        # reply is visible to the read below.
        message = rt.queue.admin.get_message(message_id)
        follow.steps()
        follow.replies(conversation, message)
        if message is None or message.status in (MessageStatus.COMPLETED, MessageStatus.DEAD):
            # Its reply is written in the same transaction that completes it: it was read above.
            follow.flush("\n".join(r.message for r in follow.outcome.replies))
            follow.outcome.status = MessageStatus.COMPLETED if message is None else message.status
            return follow.outcome
        if follow.held is not None and time.monotonic() - follow.held[1] >= STEP_HOLD:
            follow.flush()
        follow.check_processor()
        if time.monotonic() >= deadline:
            follow.flush()
            return follow.outcome
        rt.waker.wait(generation, follow.pause(deadline))
