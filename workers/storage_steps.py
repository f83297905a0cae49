"""What the processor does about storage trouble (a full disk, a database server away): the part of
:class:`workers.processor.Processor` that keeps the writes the database refused and makes them again
(:class:`workers.pauses.StorageOutage`), takes back its own claims that no run holds, and tells the chats
whose messages waited long because of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from shared.aio import call
from shared.clock import now_ms
from shared.queue.core import QueuedMessage, ResponseDraft, group_by_conversation
from shared.runtime import Runtime
from shared.storage.db import Tx
from workers.drive import Drive
from workers.liveness import note_target
from workers.pauses import Outage, StorageOutage, WaitedNote, waited_text
from workers.processor_config import ProcessorSettings

log = logging.getLogger("agentpost.processor")

T = TypeVar("T")

#: A note about a storage outage is considered only for refusals this recent (a quick first check).
_LONGEST_WAIT_MS = 24 * 3600 * 1000


class StorageSteps:
    """The storage-trouble steps of the processor (a mixin: :class:`workers.processor.Processor` provides
    the state)."""

    rt: Runtime
    config: ProcessorSettings
    worker: str
    outage: StorageOutage
    _stopping: bool
    _last_recover: float
    _drives: dict[str, Drive]
    _claiming: int
    _claims_begun: int
    _told_waiting: dict[tuple[str, str], int]

    if TYPE_CHECKING:

        def _slot_freed(self) -> None: ...

    async def _persist(self, what: str, write: Callable[[], T]) -> T:
        """``write()`` until the database takes it (see :meth:`workers.pauses.StorageOutage.keep_trying`):
        a claim, a run's start, an outcome or a release refused by a full disk or a server away is kept,
        not dropped. When it ends an outage, the chats that waited long are told before this drive goes
        on (so the note comes before their answers), and the loop is woken to take back what the outage
        stranded."""
        result = await self.outage.keep_trying(what, write, stopping=lambda: self._stopping)
        ended = self.outage.take_ended()
        if ended:
            await self._tell_waiting(ended[-1])
            self._last_recover = 0.0
            self._slot_freed()
        return result

    async def _sweep_stranded(self) -> None:
        """Put back this worker's claims that no drive holds: ones whose claim committed although the
        connection dropped before it said so, or whose outcome could not be written. Recovery leaves them
        to a live holder, and the holder is this process, so only it can see they run nowhere."""
        if self._claiming:
            return  # a claim's rows may be committed and not yet held: look again next round
        begun = self._claims_begun
        mine = await call(self.rt.queue.claims_of, self.worker)
        if not mine or self._claiming or begun != self._claims_begun:
            return
        held = {i for drive in self._drives.values() for i in drive.held_ids()}
        stranded = [i for i in mine if i not in held]
        if not stranded:
            return
        outcome = await call(self.rt.queue.release_stranded, self.worker, stranded)
        log.warning(
            "took back %d claim(s) of this processor that no run held: %s%s",
            len(outcome.retried) + len(outcome.dead),
            ", ".join(stranded),
            f" ({len(outcome.dead)} now dead)" if outcome.dead else "",
        )

    async def _tell_waiting(self, outage: Outage) -> None:
        """After an outage: one note to each chat whose waiting message (of an agent driven here) has
        waited longer than ``progress_note_seconds`` (the wait after which a running chat hears "still
        working"; 0: no notes) while the database refused writes, unless that chat was told already
        during this wait."""
        threshold = int(self.config.progress_note_seconds * 1000)
        if not threshold or self.outage.refused_since(outage.started_ms - _LONGEST_WAIT_MS) < threshold:
            return
        del outage  # each chat is told the time refused during its own wait
        try:
            agents = set(self._drives) | set((await call(self.rt.queue.claims_of, self.worker)).values())
        except Exception as exc:
            log.warning("could not tell the waiting chats about the outage: %s", exc)
            return
        for agent in sorted(agents):
            try:
                waiting = await call(self.rt.queue.waiting_messages, agent)
                for batch in group_by_conversation(waiting):
                    note = self._waited_note(batch[0])
                    if note is not None:
                        await call(self.rt.db.run_transaction, note.write)
                        note.told()
            except Exception as exc:  # a note is a courtesy: the messages themselves go on regardless
                log.warning("agent %s: could not tell the waiting chats about the outage: %s", agent, exc)

    def _waited_note(self, first: QueuedMessage) -> WaitedNote | None:
        """What tells the chat of ``first`` (the oldest message of a group) why it waited, when the database
        refused writes for longer than ``progress_note_seconds`` of its wait and the chat has not been told
        during it; None otherwise. Written in the transaction of the group's outcome, the note goes before
        the answer; the chat counts as told once that transaction has committed (``told()``)."""
        target = note_target(first)
        threshold = int(self.config.progress_note_seconds * 1000)
        kind = self.outage.last_kind
        if target is None or not threshold or kind is None:
            return None
        refused = self.outage.refused_since(first.created_at)
        if refused < threshold or self._told_waiting.get(target.key, 0) >= first.created_at:
            return None
        draft = ResponseDraft.to(
            target,
            waited_text(kind, refused),
            metadata={
                "kind": "progress",
                "notice": "storage_wait",
                "edit_key": f"storage_wait_{first.message_id}",
                "agent": first.agent,
            },
        )

        def write(tx: Tx) -> None:
            self.rt.queue.note_in(tx, first.message_id, first.agent, draft)

        def told() -> None:
            self._told_waiting[target.key] = now_ms()

        return WaitedNote(write, told)
