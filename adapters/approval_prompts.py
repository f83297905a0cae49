"""An agent's questions before a tool runs, in the chat (``permission_mode = "ask"``; the requests themselves
are :mod:`shared.queue.approvals`).

- **Showing** (a part of delivery, :class:`adapters.delivery.Delivery`): a response with metadata ``{"kind":
  "approval", "approval_id": ID}`` is the question. It is sent with Allow / Deny / Allow for this chat
  buttons through :meth:`adapters.platform.Platform.send_question`, and the platform's id of that message is
  kept with the request. A question whose request no longer waits when its turn to be sent comes (the
  adapter was down until after its time) is not sent: what became of it follows. ``{"kind":
  "approval_closed"}`` is what became of it: the question is edited to it (its buttons gone) through
  :meth:`~adapters.platform.Platform.close_question`, or it is sent as a new message where that cannot be.
- **Answering**: a press (:class:`adapters.platform.Press`, through :meth:`adapters.intake.Intake.press`)
  or the chat commands ``/allow``, ``/allow chat``, ``/deny`` answer the request — only for the person who
  sent the message, and at most once (:func:`shared.queue.approvals.answer`); whoever answered is told what
  it did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from adapters.platform import Button, Press, PressOutcome
from shared.aio import call
from shared.chat.address import ChatAddress
from shared.queue import approvals
from shared.queue.approvals import CHOICE_LABELS, CHOICES, Choice
from shared.queue.core import QueuedResponse
from shared.runtime import Runtime
from shared.storage.db import Tx

if TYPE_CHECKING:
    from adapters.platform import Platform
    from adapters.progress_notes import SendFailed

#: The response kinds this module delivers.
KINDS = frozenset({"approval", "approval_closed"})


def buttons_for(approval_id: str) -> list[Button]:
    """The buttons under a question; a press hands back ``ID:choice``."""
    return [Button(CHOICE_LABELS[choice], f"{approval_id}:{choice}") for choice in CHOICES]


def parse_press(data: str) -> tuple[str, Choice] | None:
    """``(approval id, choice)`` of a press's data, or None when it is not an answer to a question."""
    approval_id, _, picked = data.rpartition(":")
    choice = next((c for c in CHOICES if c == picked), None)
    if not approval_id.startswith("apr_") or choice is None:
        return None
    return approval_id, choice


class ApprovalPrompts:
    """Sends one channel's questions and edits them to their answers (see the module docstring)."""

    def __init__(self, platform: Platform, *, worker: str, lease_ms: int, send_failed: SendFailed) -> None:
        self.platform = platform
        self.rt = platform.rt
        self.worker = worker
        self.lease_ms = lease_ms
        self.send_failed = send_failed

    async def deliver(self, response: QueuedResponse) -> bool:
        """Send (or edit) what a claimed question or answer ``response`` says, then ack it. Returns True when
        the response was finished by this call."""
        queue, conversation = self.rt.queue, response.conversation
        approval_id = str((response.metadata or {}).get("approval_id") or "")
        approval = await call(approvals.get, self.rt.db, approval_id)
        if response.delivered == 0:
            shown: str | None = None
            try:
                if response.metadata.get("kind") == "approval":
                    if approval is not None and approval.waiting():
                        buttons = buttons_for(approval_id)
                        shown = (
                            await self.platform.send_question(conversation, response.message, buttons) or ""
                        )
                else:
                    await self._close(conversation, approval, response.message)
            except Exception as exc:
                return await self.send_failed(response, 0, exc)

            def keep_shown(tx: Tx) -> None:
                if shown is not None:
                    approvals.shown_in(tx, approval_id, shown)

            held = await call(
                queue.responses.mark_chunk_delivered,
                response.id,
                self.worker,
                0,
                lease_ms=self.lease_ms,
                platform_id=shown or None,
                ack=True,
                also=keep_shown,
            )
            return bool(held)
        return bool(await call(queue.responses.ack_response, response.id, self.worker))

    async def _close(self, conversation: str, approval: approvals.Approval | None, text: str) -> None:
        """Edit the question to what became of it; send it as a new message where the question cannot be
        edited (or was never sent)."""
        shown = approval.shown_id if approval is not None else ""
        if shown and await self.platform.close_question(conversation, shown, text):
            return
        await self.platform.send_text(conversation, text)


def answer_press(rt: Runtime, channel: str, press: Press) -> PressOutcome:
    """Apply a button press to its request; what it did."""
    parsed = parse_press(press.data)
    if parsed is None:
        return PressOutcome("This button no longer does anything.", decided=False)
    approval_id, choice = parsed
    asker = ChatAddress(channel, press.sender, press.sender_id, press.conversation)
    answered = approvals.answer(
        rt.db,
        rt.queue.responses,
        approval_id,
        choice,
        by=press.sender or press.sender_id,
        via="chat",
        asker=asker,
    )
    return PressOutcome(answered.text, decided=answered.outcome == "applied")


def answer_in_words(rt: Runtime, chat: ChatAddress, command: str, args: str) -> str:
    """``/allow``, ``/allow chat``, ``/deny`` [ID]: answer the oldest request of this chat the sender may
    answer (or the one named)."""
    words = args.split()
    named = next((w for w in words if w.startswith("apr_")), "")
    choice: Choice = "deny" if command == "deny" else ("chat" if {"chat", "always"} & set(words) else "allow")
    waiting = approvals.waiting_in_chat(rt.db, chat)
    if named:
        waiting = [a for a in waiting if a.id == named]
    mine = [a for a in waiting if not a.chat.sender_id or a.chat.sender_id == chat.sender_id]
    if not mine:
        if waiting:
            return (
                f"Only {waiting[0].chat.sender or 'the person who sent the message'} can answer that request."
            )
        return (
            f"No request {named} waits for an answer here."
            if named
            else "Nothing waits for your answer here."
        )
    target = mine[0]
    answered = approvals.answer(
        rt.db, rt.queue.responses, target.id, choice, by=chat.sender or chat.sender_id, via="chat", asker=chat
    )
    return answered.text
