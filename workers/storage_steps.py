"""What the processor does about storage trouble (a full disk, a database server away): it keeps the writes
the database refused and makes them again (:class:`workers.pauses.StorageOutage`), takes back its own claims
that no run holds, and tells the chats whose messages waited long because of it.

:class:`StorageSteps` is one part of :class:`workers.processor.Processor`, built with what it needs: the
runtime (queue and database), the worker id, the ``[processor]`` settings in force, whether the processor is
stopping, what its drives hold, and what to do when an outage ends.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

from shared.aio import call
from shared.clock import now_ms
from shared.queue.core import QueuedMessage, ResponseDraft, group_by_conversation
from shared.runtime import Runtime
from shared.storage.db import Tx
from workers.liveness import note_target
from workers.pauses import Outage, StorageOutage, WaitedNote, waited_text
from workers.processor_config import ProcessorSettings

log = logging.getLogger("agentpost.processor")

T = TypeVar("T")

#: A note about a storage outage is considered only for refusals this recent (a quick first check).
_LONGEST_WAIT_MS = 24 * 3600 * 1000


class StorageSteps:
    """The storage-trouble steps of one processor (see the module docstring).

    ``config`` gives the ``[processor]`` settings in force, ``stopping`` whether the processor is stopping,
    ``held`` the agents driven now and the message ids their drives hold, and ``on_outage_end`` is called
    when a write ends an outage (the processor then looks for stranded claims at once)."""

    def __init__(
        self,
        rt: Runtime,
        worker: str,
        *,
        config: Callable[[], ProcessorSettings],
        stopping: Callable[[], bool],
        held: Callable[[], dict[str, list[str]]],
        on_outage_end: Callable[[], None],
    ) -> None:
        self.rt = rt
        self.worker = worker
        self.outage = StorageOutage(rt.db.url)
        self._config = config
        self._stopping = stopping
        self._held = held
        self._on_outage_end = on_outage_end
        #: Claims under way (their rows may be committed but not yet held by a drive), and how many began.
        self._claiming = 0
        self._claims_begun = 0
        #: When each chat was last told its message waited through a storage outage (epoch ms).
        self._told_waiting: dict[tuple[str, str], int] = {}

    @contextlib.contextmanager
    def claiming(self) -> Iterator[None]:
        """Around a claim: while one is under way its rows may be committed and not yet held by a drive,
        so :meth:`sweep_stranded` leaves this worker's claims alone."""
        self._claiming += 1
        self._claims_begun += 1
        try:
            yield
        finally:
            self._claiming -= 1

    async def persist(self, what: str, write: Callable[[], T]) -> T:
        """``write()`` until the database takes it (see :meth:`workers.pauses.StorageOutage.keep_trying`):
        a claim, a run's start, an outcome or a release refused by a full disk or a server away is kept,
        not dropped. When it ends an outage, the chats that waited long are told before this drive goes
        on (so the note comes before their answers), and the processor is told (``on_outage_end``) to take
        back what the outage stranded."""
        result = await self.outage.keep_trying(what, write, stopping=self._stopping)
        ended = self.outage.take_ended()
        if ended:
            await self._tell_waiting(ended[-1])
            self._on_outage_end()
        return result

    async def sweep_stranded(self) -> None:
        """Put back this worker's claims that no drive holds: ones whose claim committed although the
        connection dropped before it said so, or whose outcome could not be written. Recovery leaves them
        to a live holder, and the holder is this process, so only it can see they run nowhere."""
        if self._claiming:
            return  # a claim's rows may be committed and not yet held: look again next round
        begun = self._claims_begun
        mine = await call(self.rt.queue.failures.claims_of, self.worker)
        if not mine or self._claiming or begun != self._claims_begun:
            return
        held = {i for ids in self._held().values() for i in ids}
        stranded = [i for i in mine if i not in held]
        if not stranded:
            return
        outcome = await call(self.rt.queue.failures.release_stranded, self.worker, stranded)
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
        threshold = int(self._config().progress_note_seconds * 1000)
        if not threshold or self.outage.refused_since(outage.started_ms - _LONGEST_WAIT_MS) < threshold:
            return
        del outage  # each chat is told the time refused during its own wait
        try:
            agents = set(self._held()) | set(
                (await call(self.rt.queue.failures.claims_of, self.worker)).values()
            )
        except Exception as exc:
            log.warning("could not tell the waiting chats about the outage: %s", exc)
            return
        for agent in sorted(agents):
            try:
                waiting = await call(self.rt.queue.admin.waiting_messages, agent)
                for batch in group_by_conversation(waiting):
                    note = self.waited_note(batch[0])
                    if note is not None:
                        await call(self.rt.db.run_transaction, note.write)
                        note.told()
            except Exception as exc:  # a note is a courtesy: the messages themselves go on regardless
                log.warning("agent %s: could not tell the waiting chats about the outage: %s", agent, exc)

    def waited_note(self, first: QueuedMessage) -> WaitedNote | None:
        """What tells the chat of ``first`` (the oldest message of a group) why it waited, when the database
        refused writes for longer than ``progress_note_seconds`` of its wait and the chat has not been told
        during it; None otherwise. Written in the transaction of the group's outcome, the note goes before
        the answer; the chat counts as told once that transaction has committed (``told()``)."""
        target = note_target(first)
        threshold = int(self._config().progress_note_seconds * 1000)
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
            self.rt.queue.responses.note_in(tx, first.message_id, first.agent, draft)

        def told() -> None:
            self._told_waiting[target.key] = now_ms()

        return WaitedNote(write, told)
