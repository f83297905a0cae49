"""Failure and recovery: a claimed group failed (retried after a backoff, or a dead letter), and the claims of
workers that died taken back. The part ``Queue.failures``.

What a failure costs and what the chat is told follows one rule: a counted attempt (an error) backs off and
retries up to ``max_retries``; an uncounted one (a rate limit, a release) waits as long as it is told; a
permanent error dies at once. A dead message's chat gets one plain notice — a teammate's message (a handoff)
the user chat its chain started from — in the transaction that buries it; a retried one one "trying again"
note, edited in place (a teammate's retries are silent: the user did not write to it). Recovery charges nothing for a message merely claimed and one *interrupted run* for a
message whose run had started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from shared.backoff import Backoff
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.notices import gave_up_notice, retry_note, teammate_gave_up_notice
from shared.queue.delivery import Responses
from shared.queue.messages import take_group
from shared.queue.records import (
    INTERNAL_CHANNELS,
    TEAMMATE_CHANNELS,
    FailOutcome,
    ResponseDraft,
    TxWork,
    told_at,
)
from shared.settings.model import QueueSettings
from shared.storage.db import Database, Row, Tx
from shared.storage.queries import failures as q
from shared.worker_identity import Holder, holder_state


class Failures:
    """Failing claimed groups and recovering dead workers' claims, the part ``Queue.failures`` (the notices
    the chats are owed go out through ``responses``)."""

    def __init__(self, db: Database, config: QueueSettings, responses: Responses) -> None:
        self.db = db
        self.config = config
        self.responses = responses

    def backoff_ms(self, attempt: int) -> int:
        """The wait before a failed message's next try, for the given failed-attempt count (1-based)."""
        return Backoff(self.config.backoff_base_seconds, self.config.backoff_max_seconds).delay_ms(attempt)

    def fail_messages(
        self,
        message_ids: Sequence[str],
        worker: str,
        error: str,
        *,
        count_attempt: bool = True,
        retry_after_ms: int | None = None,
        permanent: bool = False,
        explanation: str = "",
        advice: str = "",
        tell_retry: bool = False,
        also: TxWork | None = None,
    ) -> FailOutcome:
        """Fail a claimed group: back to ``pending`` after a backoff, or ``dead`` at ``max_retries`` — at
        once when ``permanent`` (an error that cannot succeed on a retry).

        ``error`` is the technical cause (kept in ``last_error`` for the operator); ``explanation`` says it
        in a user's words and ``advice`` what they can do. When messages die, the sender is told once with a
        notice response. With ``tell_retry`` the chat sees one note, edited on each attempt, saying the
        message will be tried again and when. With ``count_attempt=False`` (a rate limit, a release) the
        attempt is not counted and ``retry_after_ms`` sets the wait. ``also(tx)`` runs in the same
        transaction (what the failed run cost).
        Raises :class:`LeaseLost` (changing nothing) when the worker no longer holds every message.
        """
        now = now_ms()
        error = (error or "unknown error")[:2000]
        with self.db.transaction() as tx:
            rows = take_group(tx, message_ids, worker)
            outcome = self._fail_rows(
                tx,
                rows,
                error,
                now,
                count_attempt,
                retry_after_ms,
                permanent=permanent,
                explanation=explanation,
                advice=advice,
                tell_retry=tell_retry,
            )
            if also is not None:
                also(tx)
        return outcome

    def _fail_rows(
        self,
        tx: Tx,
        rows: list[Row],
        error: str,
        now: int,
        count_attempt: bool,
        retry_after_ms: int | None,
        *,
        permanent: bool = False,
        explanation: str = "",
        advice: str = "",
        tell_retry: bool = False,
    ) -> FailOutcome:
        retried: list[Row] = []
        dead: list[Row] = []
        next_at: int | None = None
        events: list[PendingEvent] = []
        for row in rows:
            attempts = int(row["retry_count"]) + (1 if count_attempt else 0)
            if permanent or (count_attempt and attempts >= self.config.max_retries):
                self._bury(tx, row, attempts, int(row["interruptions"]), error, now, events, permanent)
                dead.append(row)
                continue
            wait = retry_after_ms if retry_after_ms is not None else self.backoff_ms(max(attempts, 1))
            at = now + max(0, wait)
            next_at = at if next_at is None else min(next_at, at)
            tx.execute(
                q.RETRY_LATER,
                {"n": attempts, "err": error, "now": now, "at": at, "id": row["id"]},
            )
            retried.append(row)
            events.append(
                PendingEvent(
                    "message_failed",
                    {"attempts": attempts, "error": error, "retry_at": at, "counted": count_attempt},
                    row["message_id"],
                )
            )
        what = explanation or _short(error)
        if tell_retry and count_attempt and retried and next_at is not None:
            self._note_retry(
                tx, retried[0], int(retried[0]["retry_count"]) + 1, next_at - now, what, now, events
            )
        self._notify_dead(tx, dead, what, advice, permanent, now, events)
        append_events(tx, events, now)
        tx.signal("messages")
        return FailOutcome([r["message_id"] for r in retried], [r["message_id"] for r in dead], next_at)

    @staticmethod
    def _bury(
        tx: Tx,
        row: Row,
        attempts: int,
        interruptions: int,
        error: str,
        now: int,
        events: list[PendingEvent],
        permanent: bool,
    ) -> None:
        tx.execute(
            q.BURY,
            {"n": attempts, "i": interruptions, "err": error, "now": now, "id": row["id"]},
        )
        events.append(
            PendingEvent(
                "message_dead",
                {
                    "attempts": attempts,
                    "interruptions": interruptions,
                    "error": error,
                    "permanent": permanent,
                },
                row["message_id"],
            )
        )

    def _note_retry(
        self, tx: Tx, row: Row, attempt: int, wait_ms: int, what: str, now: int, events: list[PendingEvent]
    ) -> None:
        if row["channel"] in INTERNAL_CHANNELS:
            return
        note = ResponseDraft(
            message=retry_note(row["agent"], attempt, self.config.max_retries, wait_ms, what),
            metadata={
                "kind": "progress",
                "edit_key": retry_edit_key(row["message_id"]),
                "agent": row["agent"],
            },
        )
        rid = self.responses.insert_response(tx, row, note, now)
        events.append(PendingEvent("retry_notice_queued", {"response_id": rid}, row["message_id"]))
        tx.signal("responses")

    def _notify_dead(
        self,
        tx: Tx,
        dead: list[Row],
        what: str,
        advice: str,
        permanent: bool,
        now: int,
        events: list[PendingEvent],
    ) -> None:
        """Tell each chat whose messages in ``dead`` were just buried, once, in the transaction that buried
        them (so a crash can neither lose the notice nor, on a re-run, write it twice). Every path that
        buries a message ends here: a failed run, a permanent error, a refusal, too many interrupted runs.

        A teammate's message (a handoff, a chat-room post) is told to the user chat its chain started from,
        naming the teammate: otherwise the user, who saw the leader say it would ask, would wait for ever."""
        # One notice per chat, in plain words, never the raw error dressed up as an answer. It carries the
        # retry note's edit key, so a "trying again" note is closed by it.
        told: set[tuple[str, str]] = set()
        for row in dead:
            target = told_at(row)
            if target is None or target.key in told:
                continue
            told.add(target.key)
            attempts = int(row["retry_count"]) + 1
            meta = {
                "kind": "dead_notice",
                "agent": row["agent"],
                "edit_key": retry_edit_key(row["message_id"]),
            }
            if row["channel"] in TEAMMATE_CHANNELS:
                notice = ResponseDraft.to(
                    target,
                    teammate_gave_up_notice(
                        row["agent"],
                        str(row["from_agent"] or ""),
                        what,
                        row["message_id"],
                        attempts=attempts,
                        permanent=permanent,
                        advice=advice,
                        # /retry in the user's chat finds a handoff's dead letter, not a chat-room post's.
                        can_retry=row["channel"] == "internal",
                    ),
                    metadata={**meta, "teammate": True},
                )
            else:
                notice = ResponseDraft(
                    message=gave_up_notice(
                        row["agent"],
                        what,
                        row["message_id"],
                        attempts=attempts,
                        permanent=permanent,
                        advice=advice,
                    ),
                    metadata=meta,
                )
            rid = self.responses.insert_response(tx, row, notice, now)
            events.append(
                PendingEvent(
                    "dead_notice_queued", {"response_id": rid, "chat": target.label}, row["message_id"]
                )
            )
        if told:
            tx.signal("responses")

    def recover_stale_messages(self, now: int | None = None) -> FailOutcome:
        """Take back the messages of workers that died.

        A claim comes back when its holder is known to be gone (a process on this host that no longer runs:
        at once, without waiting for the lease), or when its lease expired and its holder is not known to be
        alive (another host). A holder on this host that is alive keeps its claims past its lease — a stalled
        database or lease renewal is not a failure of the message — up to ``stall_ceiling_ms``.

        What it costs the message: nothing when it was merely claimed (it is back at once, uncounted and
        without a note); one *interrupted run* when a run containing it had started. Interrupted runs have
        their own budget (``max_interrupted_runs``), so a message that kills its processor every time still
        ends as a dead letter, while operators' restarts do not use up its retries. Agent leases of such
        holders are freed too.
        """
        now = now_ms() if now is None else now
        claims = self.db.read(q.CLAIMS)
        holders = self.db.read(q.LEASE_HOLDERS)
        takeable = self._takeable_at(now)
        stale = [r["message_id"] for r in claims if takeable(r["claimed_by"], r["lease_until"])]
        free = [h for h in holders if takeable(h["holder"], h["lease_until"])]
        if not stale and not free:
            return FailOutcome([], [], None)
        retried: list[str] = []
        dead: list[Row] = []
        events: list[PendingEvent] = []
        with self.db.transaction() as tx:
            for holder in free:
                # Only the lease judged above: a holder that renewed it since keeps it.
                tx.execute(
                    q.FREE_LEASE if holder["lease_until"] is None else q.FREE_LEASE_AS_SEEN,
                    {"a": holder["agent"], "h": holder["holder"], "seen": holder["lease_until"]},
                )
            self._take_back_all(tx, self._still_stale(tx, stale, takeable), now, events, retried, dead)
            append_events(tx, events, now)
            tx.signal("messages")
        return FailOutcome(retried, [r["message_id"] for r in dead], now if retried else None)

    def claims_of(self, worker: str) -> dict[str, str]:
        """The messages ``worker`` holds in ``processing``, oldest first: message id → agent."""
        rows = self.db.read(q.CLAIMS_OF, {"worker": worker})
        return {str(r["message_id"]): str(r["agent"]) for r in rows}

    def release_stranded(self, worker: str, message_ids: Sequence[str]) -> FailOutcome:
        """Put back claims a live ``worker`` holds but runs no more: it lost track of them (a claim whose
        commit it never heard of when the connection dropped, an outcome it could not write), so no
        lease expiry or dead holder would ever return them.

        As :meth:`recover_stale_messages` charges: nothing for a message merely claimed, one interrupted
        run for one whose run had started. Only rows the worker still holds are touched."""
        if not message_ids:
            return FailOutcome([], [], None)
        now = now_ms()
        params = {f"m{i}": m for i, m in enumerate(message_ids)}
        retried: list[str] = []
        dead: list[Row] = []
        events: list[PendingEvent] = []
        with self.db.transaction() as tx:
            rows = tx.rows(q.claims_of_locked(len(params)), {"worker": worker, **params})
            self._take_back_all(tx, rows, now, events, retried, dead, why="not running")
            append_events(tx, events, now)
            if rows:
                tx.signal("messages")
        return FailOutcome(retried, [r["message_id"] for r in dead], now if retried else None)

    def _takeable_at(self, now: int) -> Callable[[str | None, int | None], bool]:
        """Whether a claim or lease held by ``worker`` until ``lease_until`` may be taken back now."""
        states: dict[str, Holder] = {}

        def takeable(worker: str | None, lease_until: int | None) -> bool:
            if worker is None:
                return True
            state = states.setdefault(worker, holder_state(worker))
            if state is Holder.GONE:
                return True
            if state is Holder.ALIVE:
                return lease_until is not None and int(lease_until) < now - self.config.stall_ceiling_ms
            return lease_until is None or int(lease_until) < now

        return takeable

    @staticmethod
    def _still_stale(
        tx: Tx, stale: list[str], takeable: Callable[[str | None, int | None], bool]
    ) -> list[Row]:
        # Re-read under the write lock (SQLite) or with the rows locked (PostgreSQL): a claim completed,
        # renewed or taken back by another recovery since the look above stays as it is now, and nobody
        # changes these rows between this read and the updates that act on it.
        if not stale:
            return []
        params = {f"m{i}": m for i, m in enumerate(stale)}
        rows = tx.rows(q.claims_locked(len(params)), params)
        return [r for r in rows if takeable(r["claimed_by"], r["lease_until"])]

    def _take_back_all(
        self,
        tx: Tx,
        rows: Iterable[Row],
        now: int,
        events: list[PendingEvent],
        retried: list[str],
        dead: list[Row],
        *,
        why: str = "worker gone",
    ) -> None:
        """:meth:`_take_back` each of ``rows`` (ids put back to ``retried``, buried rows to ``dead``), and tell
        the chats of the buried ones once."""
        for row in rows:
            if self._take_back(tx, row, now, events, why=why):
                retried.append(row["message_id"])
            else:
                dead.append(row)
        self._notify_dead(
            tx,
            dead,
            "the agent stopped in the middle of it every time it tried",
            "Type /retry to try it once more; if it keeps happening, the operator can look it up.",
            False,
            now,
            events,
        )

    def _take_back(
        self, tx: Tx, row: Row, now: int, events: list[PendingEvent], *, why: str = "worker gone"
    ) -> bool:
        """Return one stale claim to ``pending``: free when its run had not started, else one interrupted
        run. False when that used up its interrupted runs (it is buried instead). ``why`` is the reason
        its release event gives."""
        worker = str(row["claimed_by"])
        if row["run_started_at"] is None:
            tx.execute(q.RELEASE, {"now": now, "id": row["id"]})
            events.append(
                PendingEvent("message_released", {"worker": worker, "reason": why}, row["message_id"])
            )
            return True
        interruptions = int(row["interruptions"]) + 1
        error = f"interrupted: the processor running it stopped (worker {worker}, {why})"
        if interruptions >= self.config.max_interrupted_runs:
            self._bury(tx, row, int(row["retry_count"]), interruptions, error, now, events, False)
            return False
        tx.execute(
            q.INTERRUPTED,
            {"i": interruptions, "err": error, "now": now, "id": row["id"]},
        )
        events.append(
            PendingEvent(
                "message_interrupted", {"worker": worker, "interruptions": interruptions}, row["message_id"]
            )
        )
        return True


def retry_edit_key(message_id: str) -> str:
    """The edit key of the one "trying again" note of a message (and of what closes it)."""
    return f"retry_{message_id}"


def _short(error: str) -> str:
    line = error.strip().splitlines()[0] if error.strip() else "an unknown error"
    return line[:200]
