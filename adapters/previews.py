"""The live-preview part of the channel runner: a reply shown while the agent writes it, then made the answer.

The processor keeps each streaming run's text in the database (:mod:`shared.chat.previews`, written at most
every half second, see :mod:`workers.previews`). On a platform that edits messages
(:attr:`adapters.platform.Platform.can_edit`) with ``[channels.<name>] preview`` on, :class:`Previews`:

- wakes on database changes and shows each run's text as **one message edited in place**, at most one edit
  per chat per :attr:`adapters.platform.Platform.preview_edit_seconds` (Telegram: one a second in a
  private chat, one every three seconds in a group, inside its flood limits). The preview is the first
  chunk of the text only (never split, never over the platform's limit), with a trailing "…"; it is sent
  and edited with the formatting the final reply uses (Markdown, plain text when the platform refuses it).
- hands the final reply the preview message (:meth:`Previews.take_for_final`): the delivery edits it into
  the reply's first part instead of sending a new message, so exactly one message holds the answer; a long
  reply continues with further parts as before. The record is marked done in the same write that records
  that part, so nothing edits the answer afterwards.
- continues a preview left open by a run that died (a killed processor): when a later run of the same
  messages shows its first preview, or delivers its final without one, it takes that message over
  (:meth:`Previews._take_over`), so the new text grows in it and it becomes the whole answer; the dead
  run's text is forgotten. Only one preview can be taken over; any other earlier one is closed.
- closes a preview left behind by a run that died or gave up and that nothing took over: when any other
  reply about its messages arrives (a failure notice), the old preview is edited to say it was
  interrupted and its text forgotten. When nothing comes (messages dead-lettered without a notice,
  completed by an operator), the scheduler removes the run's text and marks the preview
  (:func:`shared.chat.previews.prune_partials`); the loop looks for such marks when a run's text
  disappears, at its start and every :data:`LEFT_LOOK_SECONDS`, and closes those previews the same way.
  A preview closed this way stays closed: a later run's text goes in a new message below it.

A chat's preview edits and its final reply's first part are serialised by one lock per chat in this
process, and a preview is shown only while the run's text is still in the database (the final reply
removes it in the same transaction as it is queued), so a preview edit never lands after the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from adapters.chunking import split_message
from shared.aio import call
from shared.chat import previews
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue.core import QueuedResponse
from shared.storage.db import Tx

if TYPE_CHECKING:
    from adapters.platform import Platform

#: What a preview left behind by an interrupted run is edited to.
INTERRUPTED_TEXT = "(This answer was interrupted before it was finished; see the messages below.)"
#: The mark at the end of a preview: the text is still being written.
MORE_MARK = " …"
#: A preview an earlier run left open is taken over by a later run of its messages only when it was last
#: written this recently: a message far up the chat, which the user has scrolled past, would not be seen
#: growing into the answer (and an edit notifies no one); an older one is closed as interrupted and the
#: answer starts a new message at the bottom. A killed processor's messages are run again within seconds
#: of its restart, a failed run's after its retry backoff (five minutes at most, by default).
TAKE_OVER_SECONDS = 600.0
#: The loop looks for previews the scheduler found left behind at least this often (besides at its start
#: and whenever a run's text disappears, which is when the scheduler removed one).
LEFT_LOOK_SECONDS = 60.0


class Previews:
    """One channel's live previews (see the module docstring)."""

    def __init__(self, platform: Platform, *, stop_event: asyncio.Event, poll_interval: float) -> None:
        self.platform = platform
        self.rt = platform.rt
        self.name = platform.name
        self.log = platform.log
        self.stop_event = stop_event
        self.poll_interval = poll_interval
        self.enabled = bool(platform.can_edit and getattr(platform.config, "preview", False))
        self._locks: dict[str, asyncio.Lock] = {}
        self._edited_at: dict[str, float] = {}  # preview key → monotonic time of its last send or edit
        self._busy: dict[str, asyncio.Task[None]] = {}
        self._known: set[str] = set()  # preview keys of the rows the loop read last time
        self._left_looked_at: float | None = None

    def _chat(self, conversation: str) -> ChatAddress:
        """The chat a preview row of this channel names (every platform chat has a conversation)."""
        return ChatAddress(self.name, conversation=conversation)

    def lock(self, conversation: str) -> asyncio.Lock:
        """The lock that serialises a chat's preview edits with its final reply's first part."""
        found = self._locks.get(conversation)
        if found is None:
            found = self._locks[conversation] = asyncio.Lock()
        return found

    def render(self, text: str) -> str:
        """The preview of ``text``: its first chunk within the platform's limit, marked as unfinished."""
        room = self.platform.limit - self.platform.measure(MORE_MARK)
        chunks = split_message(text.strip(), room, length=self.platform.measure)
        return (chunks[0] if chunks else "…") + MORE_MARK

    # -- the loop --------------------------------------------------------------------------------------------
    async def loop(self) -> None:
        """Show the previews of this channel's chats until stopped (does nothing when previews are off)."""
        if not self.enabled:
            return
        waker = self.rt.waker
        while not self.stop_event.is_set():
            generation = waker.generation
            try:
                rows = await call(previews.partials, self.rt.db, self.name)
            except Exception as exc:
                self.log.info("cannot read previews: %s", exc)
                rows = []
            now = time.monotonic()
            next_due = now + self.poll_interval
            for row in rows:
                key = previews.preview_key(row.conversation, row.edit_key)
                if key in self._busy:
                    continue
                due = self._edited_at.get(key, 0.0) + self.platform.preview_edit_seconds(row.conversation)
                if due > now:
                    next_due = min(next_due, due)
                    continue
                task = asyncio.create_task(self._show(row), name=f"{self.name}-preview")
                self._busy[key] = task
                task.add_done_callback(functools.partial(self._done, key))
            self._forget_old(rows)
            if self._left_due(rows):
                await self._close_left()
            timeout = max(0.05, next_due - time.monotonic())
            await waker.wait_async(generation, timeout)
            await asyncio.sleep(0.05)  # a burst of commits wakes us once
        for task in list(self._busy.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 4)

    def _done(self, key: str, _task: asyncio.Task[None]) -> None:
        self._busy.pop(key, None)

    def _forget_old(self, rows: list[previews.Partial]) -> None:
        live = {previews.preview_key(r.conversation, r.edit_key) for r in rows}
        for key in [k for k in self._edited_at if k not in live]:
            del self._edited_at[key]
        # A lock nobody holds can go (taking a free lock never yields, so nobody is about to hold it): one
        # per chat would otherwise pile up for as long as the adapter runs.
        chats = {r.conversation for r in rows}
        for conversation in [c for c, lock in self._locks.items() if c not in chats and not lock.locked()]:
            del self._locks[conversation]

    def _left_due(self, rows: list[previews.Partial]) -> bool:
        live = {previews.preview_key(r.conversation, r.edit_key) for r in rows}
        vanished, self._known = self._known - live, live
        looked = self._left_looked_at
        return bool(vanished) or looked is None or time.monotonic() - looked >= LEFT_LOOK_SECONDS

    async def _show(self, row: previews.Partial) -> None:
        """Send or edit the preview of one run (never raises: a failed edit is tried again next time)."""
        key = previews.preview_key(row.conversation, row.edit_key)
        try:
            async with self.lock(row.conversation):
                await self._show_locked(row, key)
        except Exception as exc:
            self.log.info("preview %s in %s not shown: %s", row.edit_key, row.conversation, exc)
            self._edited_at[key] = time.monotonic()

    async def _show_locked(self, row: previews.Partial, key: str) -> None:
        db, conversation = self.rt.db, row.conversation
        # Read again under the lock: a final reply delivered since the loop read the row has removed it.
        current = await call(previews.partial, db, self._chat(conversation), row.edit_key)
        if current is None:
            return
        row = current
        record = await call(previews.shown, db, self._chat(conversation), row.edit_key)
        if record is None:  # this run's first preview: it continues an interrupted run's, if one is open
            record = await self._take_over(conversation, list(row.message_ids), row.edit_key)
            await self._close_interrupted(conversation, set(row.message_ids), keep=row.edit_key)
        if record is not None and record.get("done"):
            return
        text = self.render(row.text)
        if record is not None and record.get("text") == text:
            return
        self._edited_at[key] = time.monotonic()
        edited = bool(record and record.get("id")) and await self.platform.edit_reply(
            conversation, str((record or {})["id"]), text
        )
        if record is not None and edited:
            await call(self._store, conversation, row.edit_key, {**record, "text": text})
            return
        await self._close_interrupted(conversation, set(row.message_ids), keep=row.edit_key)
        message_id = await self.platform.send_text(conversation, text)
        new = {"id": message_id or "", "text": text, "message_ids": list(row.message_ids), "done": False}
        await call(self._store, conversation, row.edit_key, new)

    def _store(self, conversation: str, edit_key: str, record: dict[str, Any]) -> None:
        self.rt.db.run_transaction(previews.put_shown(self._chat(conversation), edit_key, record))

    async def _take_over(
        self, conversation: str, message_ids: list[str], edit_key: str
    ) -> dict[str, Any] | None:
        """Make the preview an earlier run of the same messages left open (its processor was killed, the
        messages are being run again) the preview of ``edit_key``: the new run's text then grows in that
        same message, which becomes the whole reply, instead of a half reply staying above a new one. The
        earlier run's record is marked done (nothing closes it as interrupted afterwards) and its text
        forgotten, in the same write as the new record. Returns the new record; None when no earlier
        preview is open."""
        chat = self._chat(conversation)
        wanted = set(message_ids)
        since = now_ms() - int(TAKE_OVER_SECONDS * 1000)
        open_ = [
            (key, record)
            for key, record, written_at in await call(previews.shown_entries, self.rt.db, chat)
            if key != edit_key
            and not record.get("done")
            and record.get("id")
            and written_at >= since
            and wanted & {str(i) for i in record.get("message_ids") or []}
        ]
        if not open_:
            return None
        # The one written last (entries come oldest first): the run that died last. Any other is closed as
        # interrupted by the caller.
        old_key, old = open_[-1]
        mine = {"id": old["id"], "text": old.get("text", ""), "message_ids": message_ids, "done": False}
        taken = {**old, "done": True, "taken_by": edit_key}

        def write(tx: Tx) -> None:
            previews.put_shown(chat, edit_key, mine)(tx)
            previews.put_shown(chat, old_key, taken)(tx)
            previews.clear_partial_in(tx, chat, old_key)

        await call(self.rt.db.run_transaction, write)
        self.log.info(
            "preview %s in %s continues the interrupted preview %s", edit_key, conversation, old_key
        )
        return mine

    async def _close_interrupted(self, conversation: str, message_ids: set[str], *, keep: str) -> None:
        """Edit the previews of earlier runs for the same messages (a run that died half-way) to say so,
        and forget their text. Best effort: a preview that cannot be edited is left as it is."""
        records = await call(previews.shown_in_chat, self.rt.db, self._chat(conversation))
        for edit_key, record in records.items():
            if edit_key == keep or record.get("done"):
                continue
            if not message_ids & {str(i) for i in record.get("message_ids") or []}:
                continue
            await self._close(conversation, edit_key, record, forget_text=True)
        # Text of a dead run never shown here (this adapter was down too): forgotten, or it would be shown
        # after the answer.
        unshown = [
            p.edit_key
            for p in await call(previews.partials, self.rt.db, self.name, prefix=f"{conversation}|")
            if p.conversation == conversation
            and p.edit_key != keep
            and p.edit_key not in records
            and message_ids & set(p.message_ids)
        ]
        if unshown:

            def forget(tx: Tx) -> None:
                for key in unshown:
                    previews.clear_partial_in(tx, self._chat(conversation), key)

            await call(self.rt.db.run_transaction, forget)

    async def _close(
        self,
        conversation: str,
        edit_key: str,
        record: dict[str, Any] | None,
        *,
        forget_text: bool = False,
        forget_left: bool = False,
    ) -> None:
        """Edit one run's preview message to say the answer was interrupted and mark its record done (when
        it is not done yet), forgetting the run's text and the scheduler's mark as asked, in one write.
        A preview that cannot be edited is left as it is."""
        chat = self._chat(conversation)
        closed = None
        if record is not None and not record.get("done"):
            if record.get("id"):
                try:
                    await self.platform.edit_text(conversation, str(record["id"]), INTERRUPTED_TEXT)
                except Exception as exc:
                    self.log.info("could not mark preview %s interrupted: %s", edit_key, exc)
            closed = {**record, "done": True, "text": INTERRUPTED_TEXT}

        def write(tx: Tx) -> None:
            if closed is not None:
                previews.put_shown(chat, edit_key, closed)(tx)
            if forget_text:
                previews.clear_partial_in(tx, chat, edit_key)
            if forget_left:
                previews.forget_left_in(tx, chat, edit_key)

        await call(self.rt.db.run_transaction, write)

    async def _close_left(self) -> None:
        """Close the previews whose run's text the scheduler removed (the run died and nothing answered its
        messages since). Never raises: what fails is tried again at the next look."""
        self._left_looked_at = time.monotonic()
        try:
            marks = await call(previews.left, self.rt.db, self.name)
        except Exception as exc:
            self.log.info("cannot read left previews: %s", exc)
            return
        for conversation, edit_key in marks:
            chat = self._chat(conversation)
            try:
                async with self.lock(conversation):
                    # A run writing under the same key again (a retry's key) has taken the preview over.
                    if await call(previews.partial, self.rt.db, chat, edit_key) is None:
                        record = await call(previews.shown, self.rt.db, chat, edit_key)
                    else:
                        record = None
                    await self._close(conversation, edit_key, record, forget_left=True)
            except Exception as exc:
                self.log.info("could not close left preview %s in %s: %s", edit_key, conversation, exc)

    # -- the final reply -------------------------------------------------------------------------------------
    async def close_stale(self, response: QueuedResponse, edit_key: str) -> None:
        """Before a reply about ``response.message_id`` that has no preview of its own (a failure notice, a
        reply of another run): close the previews earlier runs left for that message. Never raises."""
        if not self.enabled or not response.message_id:
            return
        try:
            async with self.lock(response.conversation):
                await self._close_interrupted(response.conversation, {response.message_id}, keep=edit_key)
        except Exception as exc:
            self.log.info("could not close old previews in %s: %s", response.conversation, exc)

    async def take_for_final(
        self, response: QueuedResponse, edit_key: str
    ) -> tuple[str, Callable[[Tx], None]] | None:
        """The preview message the final reply of ``edit_key`` should become: ``(platform message id, the
        write marking it done)``; None when there is none (send a new message). Call under
        :meth:`lock`. Earlier previews of the same messages (interrupted runs) are closed first."""
        if not self.enabled:
            return None
        conversation = response.conversation
        record = await call(previews.shown, self.rt.db, self._chat(conversation), edit_key)
        if record is None:  # a run that showed no preview of its own: it may finish an interrupted run's
            record = await self._take_over(conversation, [response.message_id], edit_key)
        await self._close_interrupted(conversation, {response.message_id}, keep=edit_key)
        if record is None or record.get("done") or not record.get("id"):
            return None
        return str(record["id"]), previews.put_shown(
            self._chat(conversation), edit_key, {**record, "done": True}
        )
