"""The processor's half of live previews: the text a run streams goes to the database at a bounded rate.

A :class:`PreviewWriter` is given to the provider as ``RunRequest.on_partial`` (the text of the assistant
message being written, each time it grew) and writes the latest text to ``kv`` (:mod:`shared.chat.previews`)
from a task of its own, never from the provider's read loop, so a slow database never holds up the CLI's
output.

**The rate.** At most one write per :data:`WRITE_SECONDS` (0.5 s) per streaming run, coalesced: whatever
arrived in between is one write of the latest text. Why 0.5 s: the platforms edit a message at most about
once a second (Telegram's limit per chat), so fresher text than every half second is never seen; and a
write of a tiny row twice a second per run is nothing next to a run's own cost (a CLI streams a dozen
deltas a second, one write each would be a transaction per token). The first write waits one interval
too: a reply streamed in under half a second (most short answers) costs no write at all, and its final
arrives as fast as today.

Exactly one final: before the run's outcome is written the writer is stopped (:meth:`PreviewWriter.stop`
waits for a write in flight), and the row is removed in the same transaction as the final reply
(:meth:`PreviewWriter.clear_in`) — or on its own when the run ends another way.

**The bounds.** A preview holds at most the first :data:`shared.chat.previews.PREVIEW_MAX_CHARS` (8,000)
characters of the text, so a text past them stops changing and costs no more writes; and a run writes at
most :data:`RUN_MAX_CHARS` of preview text in all (each write is the whole text, and is kept on the event
log): past them its preview stays as it is until the final reply replaces it. A reply of 20 MB streamed for
minutes costs a few preview writes, not a stream of ever larger ones.

The text written is the text so far as the final reply will show it
(:func:`shared.settings.routing.render_partial_reply`): handoff tags rendered, send_file tags removed, and a
tag still being written at its end left out, so no preview shows raw tag syntax the final hides.

Each write also appends an ``agent_preview`` event (topic ``progress``; ``message:preview`` on the web's
event stream) with the whole text so far, in the same transaction: a web client sees the reply grow with no
extra commit, and a reader that missed one event loses nothing (each carries the whole text).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import anyio

from shared.aio import call
from shared.chat import previews
from shared.chat.address import ChatAddress
from shared.events.log import PendingEvent, append_events
from shared.queue.core import QueuedMessage, TxWork
from shared.settings.channels import channel_model
from shared.settings.model import Settings
from shared.settings.routing import render_partial_reply
from shared.storage.db import Database, Tx
from workers.liveness import note_target

log = logging.getLogger("agentpost.processor")

#: At most one write of a run's partial text per this many seconds (see the module docstring).
WRITE_SECONDS = 0.5
#: A run writes at most this many characters of preview text in all (see the module docstring).
RUN_MAX_CHARS = 1_000_000


def previews_on(settings: Settings, channel: str) -> bool:
    """``[channels.<channel>] preview``: whether chats of ``channel`` get live previews (the channel's
    default when unset: on where the platform edits messages, off on WhatsApp)."""
    section = settings.file.channels.get(channel)
    if isinstance(section, Mapping) and isinstance(section.get("preview"), bool):
        return bool(section["preview"])
    model = channel_model(channel)
    field = model.model_fields.get("preview") if model is not None else None
    return bool(field.default) if field is not None else False


class PreviewWriter:
    """Writes one run's partial text for one chat (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        chat: ChatAddress,
        edit_key: str,
        message_ids: list[str],
        *,
        interval: float = WRITE_SECONDS,
    ) -> None:
        self.db = db
        self.chat = chat
        self.edit_key = edit_key
        self.message_ids = message_ids
        self.interval = interval
        self.latest = ""
        self.written_text = ""
        self.written = False  # a row may exist: the end of the run removes it
        self.spent = 0  # characters of preview text this run has written (RUN_MAX_CHARS)
        self.first_at: float | None = None
        self._grew = anyio.Event()
        self._stopped = False

    @classmethod
    def for_run(
        cls, db: Database, settings: Settings, primary: QueuedMessage, edit_key: str, message_ids: list[str]
    ) -> PreviewWriter | None:
        """The writer for a run answering ``primary``; None when its reply goes to no user chat or the
        chat's channel has previews off."""
        chat = note_target(primary)
        if chat is None or not previews_on(settings, chat.channel):
            return None
        return cls(db, chat, edit_key, message_ids)

    def update(self, text: str) -> None:
        """``RunRequest.on_partial``: the text so far (an empty text, a new message starting, keeps the
        last preview until the new one has words)."""
        if self._stopped or not text.strip():
            return
        self.latest = previews.bounded_preview(text)
        if self.first_at is None:
            self.first_at = time.monotonic()
        self._grew.set()

    async def run(self) -> None:
        """Write the latest text at most every :attr:`interval`, until cancelled (each write finishes
        even then, so :meth:`stop` leaves no write behind the final)."""
        while True:
            await self._grew.wait()
            self._grew = anyio.Event()
            assert self.first_at is not None
            await anyio.sleep(max(0.0, self.first_at + self.interval - time.monotonic()))
            # Shown as the final will be (no raw tags, no half-written one): rendered here, at most once per
            # write, not on every delta.
            text = render_partial_reply(self.latest)
            if (
                text == self.written_text
                or not text.strip()
                or self._stopped
                or self.spent + len(text) > RUN_MAX_CHARS
            ):
                continue
            self.spent += len(text)
            with anyio.CancelScope(shield=True):
                try:
                    self.written = True
                    await call(self.db.run_transaction, self.work(text))
                    self.written_text = text
                except Exception as exc:  # a busy database: the next interval writes the newer text
                    log.info("preview of %s in %s not written: %s", self.edit_key, self.chat.label, exc)
            await anyio.sleep(self.interval)

    def work(self, text: str) -> TxWork:
        """The write of ``text`` (the partial text and its event), for a transaction."""
        chat, key, ids = self.chat, self.edit_key, self.message_ids

        payload = {"channel": chat.channel, "conversation": chat.conversation, "edit_key": key, "text": text}
        event = PendingEvent("agent_preview", {**payload, "message_ids": ids}, ids[0], topic="progress")

        def write(tx: Tx) -> None:
            previews.put_partial(tx, chat, key, text, ids)
            # The same text on the event log (web clients' event stream shows it growing); one commit.
            append_events(tx, [event])

        return write

    def stop(self) -> None:
        """No more writes (called before the run's outcome; the caller then cancels :meth:`run`)."""
        self._stopped = True

    def clear_in(self, tx: Tx) -> None:
        """Remove the row in the caller's transaction (the final reply's), when one was written."""
        if self.written:
            previews.clear_partial_in(tx, self.chat, self.edit_key)

    async def clear(self) -> None:
        """Remove the row on its own (a run that ended without a final reply); never raises."""
        if not self.written:
            return
        try:
            await call(previews.clear_partial, self.db, self.chat, self.edit_key)
        except Exception as exc:
            log.info("preview of %s in %s not removed: %s", self.edit_key, self.chat.label, exc)
