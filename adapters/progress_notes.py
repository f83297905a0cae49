"""Progress notes, a part of the channel runner's delivery (:class:`adapters.delivery.Delivery`).

A response with metadata ``{"kind": "progress", "edit_key": K}`` (the processor's "still working" note) is
sent once and later notes with the same key *edit that message* where the platform can
(:attr:`adapters.platform.Platform.can_edit`); elsewhere a new note is sent at most every
``progress_min_interval_seconds``. The platform's message id per key is kept by
:mod:`shared.chat.progress_notes`, so it survives a restart. The final reply (``{"kind": "final",
"edit_key": K}``, or any other reply) is always a new message; afterwards the note is edited to a short
"done" and later notes of that key are dropped.

The delivery decides when (it claims the responses and sends the final reply's parts); this module keeps
the one note per key: its stored record, sending or editing it, and closing it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from adapters.chunking import split_message
from shared.aio import call
from shared.chat.progress_notes import keep_progress_note_in, progress_note
from shared.clock import now_ms
from shared.queue.core import QueuedResponse, TxWork
from shared.storage.db import Tx

if TYPE_CHECKING:
    from adapters.platform import Platform

#: The text a progress note is edited to once the final reply has been delivered.
DONE_TEXT = "Done — the reply is below."
#: The same when the reply took the place of its live preview, which may be above or below the note.
DONE_IN_PREVIEW_TEXT = "Done — the reply is in the message that showed it being written."

#: How the delivery handles a platform's refusal to send part ``index`` of a response: returns whether the
#: response was finished by it (failed for good).
SendFailed = Callable[[QueuedResponse, int, Exception], Awaitable[bool]]


class ProgressNotes:
    """One channel's progress notes (see the module docstring).

    Given the platform (sending, editing, its limits, its settings section), the delivery's worker id and
    lease (a note is a claimed response like any reply), and the delivery's handler of send errors (a
    refused note is retried or failed like any part)."""

    def __init__(self, platform: Platform, *, worker: str, lease_ms: int, send_failed: SendFailed) -> None:
        self.platform = platform
        self.rt = platform.rt
        self.config = platform.config
        self.log = platform.log
        self.worker = worker
        self.lease_ms = lease_ms
        self.send_failed = send_failed

    def record(self, conversation: str, edit_key: str) -> dict[str, Any] | None:
        """The stored progress note of ``edit_key`` in a chat: ``{"id", "at", "done"}``, or None."""
        return progress_note(self.rt.db, self.platform.name, conversation, edit_key)

    async def deliver(self, response: QueuedResponse, edit_key: str) -> bool:
        """Send or edit the one progress note of ``edit_key`` for a claimed note ``response``, then ack it.
        Returns True when the response was finished by this call (acked or failed)."""
        queue, conversation = self.rt.queue, response.conversation
        if response.delivered == 0:
            record = await call(self.record, conversation, edit_key)
            text = self._note_text(response.message)
            try:
                done = await self._send_or_edit(conversation, edit_key, record, text)
            except Exception as exc:
                return await self.send_failed(response, 0, exc)
            if done is not None:
                await call(self._store, conversation, edit_key, done)
            held = await call(
                queue.responses.mark_chunk_delivered, response.id, self.worker, 0, lease_ms=self.lease_ms
            )
            if not held:
                return False
        return bool(await call(queue.responses.ack_response, response.id, self.worker))

    async def close(self, conversation: str, edit_key: str) -> None:
        """After the final reply: edit the note to "done" (best effort) and drop later notes of the key."""
        write = await self.closing(conversation, edit_key)
        if write is not None:
            try:
                await call(self.rt.db.run_transaction, write)
            except Exception:
                self.log.exception("closing progress note %s failed", edit_key)

    async def closing(self, conversation: str, edit_key: str, *, in_preview: bool = False) -> TxWork | None:
        """The platform half of closing a note (edited to "done", best effort) and the write that records
        it done, for the caller's transaction; None when there is nothing to record. ``in_preview``: the
        final reply took the place of its live preview (the note says where the reply is)."""
        try:
            record = await call(self.record, conversation, edit_key)
            if record is None:
                # No note was sent (a short run): still remember the key so a late note is dropped.
                record = {"id": "", "at": now_ms()}
            elif record.get("done"):
                return None
            if record.get("id") and self.platform.can_edit:
                done_text = DONE_IN_PREVIEW_TEXT if in_preview else DONE_TEXT
                try:
                    await self.platform.edit_text(conversation, str(record["id"]), done_text)
                except Exception as exc:
                    self.log.info("could not mark progress note %s done: %s", edit_key, exc)
            return self._writer(conversation, edit_key, {**record, "done": True})
        except Exception:
            self.log.exception("closing progress note %s failed", edit_key)
            return None

    def _store(self, conversation: str, edit_key: str, record: dict[str, Any]) -> None:
        self.rt.db.run_transaction(self._writer(conversation, edit_key, record))

    def _writer(self, conversation: str, edit_key: str, record: dict[str, Any]) -> TxWork:
        """The write of a note's record (for a transaction of the caller's)."""
        channel = self.platform.name

        def write(tx: Tx) -> None:
            keep_progress_note_in(tx, channel, conversation, edit_key, record)

        return write

    def _note_text(self, text: str) -> str:
        """A note is one message: its text on one line, cut to the platform's limit."""
        text = " ".join(text.split()) or "…"
        chunks = split_message(text, self.platform.limit, length=self.platform.measure)
        return chunks[0] if chunks else text

    async def _send_or_edit(
        self, conversation: str, edit_key: str, record: dict[str, Any] | None, text: str
    ) -> dict[str, Any] | None:
        """Do the platform half of a note; returns the record to store (None: nothing changed)."""
        now = now_ms()
        if record is not None and record.get("done"):
            return None  # a note that arrived after the final reply: the chat already has the answer
        if record is not None and record.get("id") and self.platform.can_edit:
            if await self.platform.edit_text(conversation, str(record["id"]), text):
                return {**record, "at": now}
            self.log.info(
                "progress note %s in %s cannot be edited; sending a new one", edit_key, conversation
            )
        elif record is not None and not self.platform.can_edit:
            quiet_ms = self.config.progress_min_interval_seconds * 1000
            if now - int(record.get("at") or 0) < quiet_ms:
                return None  # no editing here: at most one note per interval
        message_id = await self.platform.send_note(conversation, text)
        return {"id": message_id, "at": now, "done": False}
