"""Claims and completions: an agent's available messages claimed together under its lease, a claimed group
completed with its reply, handoffs, chat-room posts and history in one transaction, and the mark that a run
started. The part ``Queue.messages``; every write a worker makes to a claimed group is fenced by
:func:`take_group`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from shared.chain_budget import first_hops_refusal, take_chain_run
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.notices import chain_budget_notice, handoff_refused_notice
from shared.queue.delivery import Responses
from shared.queue.enqueue import Intake
from shared.queue.leases import AgentLeases
from shared.queue.records import (
    INTERNAL_CHANNELS,
    AgentTurn,
    ChatPost,
    CompleteOutcome,
    InvalidInput,
    LeaseLost,
    MessageDraft,
    QueuedMessage,
    ResponseDraft,
    TxWork,
    to_json,
)
from shared.queue.records import sql_in as _in
from shared.settings.model import QueueSettings
from shared.storage.db import Database, Row, Tx
from shared.storage.dialect import Dialect
from shared.storage.queries import agent_leases as lq
from shared.storage.queries import messages as q
from shared.storage.statuses import MessageStatus


class Messages:
    """Claiming an agent's messages, completing a claimed group and marking its run started."""

    def __init__(
        self,
        db: Database,
        config: QueueSettings,
        intake: Intake,
        leases: AgentLeases,
        responses: Responses,
    ) -> None:
        self.db = db
        self.config = config
        self.intake = intake
        self.leases = leases
        self.responses = responses
        #: The claim statement of :meth:`claim_all_pending_messages` (public so the schema tests can check its
        #: plan: the statement itself, not a copy of it).
        self.claim_sql = q.CLAIM_PENDING
        #: The claim as one statement where the dialect has them (PostgreSQL: after the probe, BEGIN, it and
        #: COMMIT instead of five round trips).
        self.claim_statement = (
            db.dialect.write_with_events(q.CLAIM_CTES, q.CLAIMED_EVENT, ["events"], q.CLAIM_RESULT)
            if db.dialect.single_statement_writes
            else None
        )

    # -- claim ------------------------------------------------------------------------------------------
    def agents_with_pending(self, now: int | None = None) -> list[str]:
        """Agents with at least one message available now (read-only, takes no write lock)."""
        rows = self.db.read(q.AGENTS_WITH_PENDING, {"now": now_ms() if now is None else now})
        return sorted(r["agent"] for r in rows)

    def next_available_at(self) -> int | None:
        """When the earliest pending message becomes available (for sleeping through a backoff)."""
        value = self.db.read_scalar(q.NEXT_AVAILABLE_AT)
        return None if value is None else int(value)

    def claim_all_pending_messages(
        self, agent: str, worker: str, *, lease_ms: int | None = None
    ) -> list[QueuedMessage]:
        """Take the agent's lease and claim every available pending message of that agent, oldest first.

        Returns ``[]`` (changing nothing) when another worker holds the agent, the agent is paused, or
        nothing is available. The caller keeps the agent lease until :meth:`AgentLeases.release_agent`.
        """
        now = now_ms()
        lease = now + (lease_ms or self.config.lease_ms)
        # A read first, so that an agent with nothing available, or held by another worker (or paused), costs
        # no write: with several processors most attempts on a busy agent find it held. (On PostgreSQL the
        # claim statement would find the same, but it opens and locks every table and index a claim writes.)
        probe = self.db.read_scalar(q.CLAIM_PROBE, {"agent": agent, "worker": worker, "now": now})
        if probe is None:
            return []
        if self.claim_statement is not None:
            return self._claim_in_one_statement(agent, worker, now, lease)
        with self.db.transaction() as tx:
            if not self.leases.take_in(tx, agent, worker, now, lease):
                return []
            names, rows = tx.tuples(
                self.claim_sql, {"worker": worker, "lease": lease, "now": now, "agent": agent}
            )
            if not rows:
                self.leases.release_in(tx, agent, worker)
                return []
            rows.sort(key=_first)  # CLAIM_RETURNS: id, message_id, ...
            ids = [str(r[1]) for r in rows]
            append_events(
                tx,
                [
                    PendingEvent(
                        "message_claimed", {"agent": agent, "worker": worker, "message_ids": ids}, ids[0]
                    )
                ],
                now,
            )
        # Built after the commit: the write lock is held for the statements only.
        return _claimed_messages(names, rows, agent, worker, now, lease)

    def _claim_in_one_statement(self, agent: str, worker: str, now: int, lease: int) -> list[QueuedMessage]:
        """:meth:`claim_all_pending_messages` after its probe, as the dialect's one statement (the lease take,
        the claim, its event and wake-up), inside BEGIN and COMMIT: the same rows, lease and event as the
        transaction path in three round trips instead of five. Not autocommit: a claimer killed while the
        statement runs (waiting for a lock) must leave nothing claimed, and an autocommit statement would
        commit after its client was gone. The lease is taken only when a message is available, so an agent
        taken, paused or emptied since the probe changes nothing."""
        values = {"agent": agent, "worker": worker, "lease": lease, "now": now}
        assert self.claim_statement is not None
        with self.db.transaction() as tx:
            # Columns: _woken, leased, then CLAIM_RETURNS (NULL in the one row a claim of nothing returns).
            rows = list(tx.execute(self.claim_statement, values).fetchall())
            if rows[0][2] is None:
                if rows[0][1]:  # the lease was taken, but the messages were gone meanwhile: give it back
                    self.leases.release_in(tx, agent, worker)
                return []
        self.db.announce({"events"})
        rows = [r[2:] for r in rows]
        rows.sort(key=_first)
        return _claimed_messages(_CLAIM_NAMES, rows, agent, worker, now, lease)

    # -- complete / fail ---------------------------------------------------------------------------------
    def complete_messages(
        self,
        message_ids: Sequence[str],
        worker: str,
        response: ResponseDraft | str | None,
        *,
        followups: Sequence[MessageDraft] = (),
        chat_posts: Sequence[ChatPost] = (),
        history: Sequence[AgentTurn] = (),
        release_when_idle: bool = False,
        also: TxWork | None = None,
    ) -> CompleteOutcome:
        """Complete a claimed group and, in the same transaction, enqueue its response, its handoffs,
        chat-room posts and history. Handoffs beyond ``max_hops`` are refused (an event says so).

        With ``release_when_idle``, the agent's lease is given up in the same transaction when the worker
        holds no other message of the agent and none is waiting (``CompleteOutcome.released``), sparing the
        caller a transaction of its own. ``also(tx)`` runs inside the transaction too (a status record, the
        caller's events), so it commits or vanishes with the completion.

        Raises :class:`LeaseLost` (changing nothing) when the worker no longer holds every message.
        """
        now = now_ms()
        if (
            self.db.dialect.single_statement_writes
            and response is not None
            and also is None
            and not followups
            and not chat_posts
            and not history
        ):
            draft = ResponseDraft(message=response) if isinstance(response, str) else response
            return self._complete_in_one_statement(message_ids, worker, draft, release_when_idle, now)
        with self.db.transaction() as tx:
            rows = take_group(
                tx, message_ids, worker, q.COMPLETE_GROUP, {"now": now}, q.COMPLETE_GROUP_RETURNS
            )
            if also is not None:
                also(tx)  # first: the caller's events (the run's end) come before the reply's
            primary = tx.one(q.PRIMARY, {"id": rows[0]["id"]})
            if primary is None:  # the row was updated by this transaction a moment ago
                raise RuntimeError(f"message {rows[0]['message_id']} vanished during its completion")
            ids = [r["message_id"] for r in rows]
            response_id: int | None = None
            events: list[PendingEvent] = []
            if response is not None:
                draft = ResponseDraft(message=response) if isinstance(response, str) else response
                response_id = self.responses.insert_response(tx, primary, draft, now)
                events.append(
                    PendingEvent(
                        "response_ready",
                        {
                            "message_ids": ids,
                            "response_id": response_id,
                            "agent": primary["agent"],
                            "channel": draft.channel or primary["channel"],
                        },
                        primary["message_id"],
                    )
                )
            else:
                events.append(PendingEvent("message_completed", {"message_ids": ids}, primary["message_id"]))
            queued, refused = self._queue_followups(tx, primary, followups, now, events)
            self._record_posts_and_history(tx, chat_posts, history, now)
            released = release_when_idle and self.leases.release_if_idle_in(
                tx, str(primary["agent"]), worker, now
            )
            append_events(tx, events, now)
            tx.signal("responses")
        return CompleteOutcome(response_id, queued, refused, released)

    def _complete_in_one_statement(
        self, message_ids: Sequence[str], worker: str, draft: ResponseDraft, release_when_idle: bool, now: int
    ) -> CompleteOutcome:
        """The plain completion (a reply, nothing else in the transaction) as the dialect's one statement:
        the same fence, rows, response, event, lease release and wake-ups as the transaction path, in one
        round trip instead of seven. The group's rows are locked first and completed only when the worker
        still holds every one of them; otherwise nothing changes and :class:`LeaseLost` is raised."""
        if not message_ids:
            raise InvalidInput("no message ids given")
        _, params = _in("m", list(message_ids))
        wanted = len(set(message_ids))
        sql = _complete_statement(self.db.dialect, len(message_ids))
        values = {
            **params,
            "worker": worker,
            "now": now,
            "wanted": wanted,
            "release": release_when_idle,
            "channel": draft.channel or None,
            "sender": draft.sender,
            "sender_id": draft.sender_id,
            "conversation": draft.conversation,
            "message": draft.message,
            "files": to_json(list(draft.files)),
            "metadata": to_json(dict(draft.metadata)),
        }
        rows = self.db.write_statement_values(sql, values)
        _woken, held, response_id, released = rows[0]
        if response_id is None:
            raise LeaseLost(
                f"worker {worker} no longer holds {wanted - int(held)} of {len(message_ids)} messages"
            )
        self.db.announce({"events", "responses"})
        return CompleteOutcome(int(response_id), [], 0, bool(released))

    def _queue_followups(
        self, tx: Tx, primary: Row, followups: Sequence[MessageDraft], now: int, events: list[PendingEvent]
    ) -> tuple[list[str], int]:
        """Queue a completion's handoffs within ``max_hops`` and the chain's run budget; returns the new
        message ids and how many were refused (each refusal is an event)."""
        queued: list[str] = []
        refused = 0
        too_far: list[MessageDraft] = []
        for draft_msg in followups:
            if draft_msg.hops > self.config.max_hops:
                refused += 1
                too_far.append(draft_msg)
                events.append(
                    PendingEvent(
                        "chain_handoff_refused",
                        {"to": draft_msg.agent, "hops": draft_msg.hops, "max_hops": self.config.max_hops},
                        primary["message_id"],
                    )
                )
                continue
            root = _chain_root(draft_msg)
            if root is not None:
                granted, first_refusal = take_chain_run(tx, root, self.config.max_chain_runs, now)
                if not granted:
                    refused += 1
                    events.append(
                        PendingEvent(
                            "chain_budget_spent",
                            {"to": draft_msg.agent, "max_chain_runs": self.config.max_chain_runs},
                            primary["message_id"],
                        )
                    )
                    if first_refusal:
                        self._tell_budget_spent(tx, primary, draft_msg, root, now)
                    continue
            mid = self.intake.insert_draft(tx, draft_msg, now)
            if mid is not None:
                queued.append(mid)
                events.append(
                    PendingEvent(
                        "chain_handoff",
                        {
                            "from": draft_msg.from_agent,
                            "to": draft_msg.agent,
                            "message_id": mid,
                            "hops": draft_msg.hops,
                        },
                        primary["message_id"],
                    )
                )
        if too_far:
            self._tell_too_far(tx, primary, too_far, now)
        return queued, refused

    @staticmethod
    def _record_posts_and_history(
        tx: Tx, chat_posts: Sequence[ChatPost], history: Sequence[AgentTurn], now: int
    ) -> None:
        for post in chat_posts:
            tx.execute(
                q.INSERT_CHAT_POST,
                {"team": post.team_id, "agent": post.from_agent, "message": post.message, "now": now},
            )
        for turn in history:
            tx.execute(
                q.INSERT_AGENT_TURN,
                {
                    "agent": turn.agent_id,
                    "role": turn.role,
                    "channel": turn.channel,
                    "sender": turn.sender,
                    "mid": turn.message_id,
                    "content": turn.content,
                    "now": now,
                },
            )

    def _tell_budget_spent(self, tx: Tx, primary: Row, draft: MessageDraft, root: str, now: int) -> None:
        origin = _user_origin(draft)
        if origin is None:
            return
        agent = draft.from_agent or str(primary["agent"])
        notice = ResponseDraft.to(
            origin,
            chain_budget_notice(agent, [draft.agent], self.config.max_chain_runs, root),
            metadata={"kind": "budget_notice", "agent": agent},
        )
        self.responses.insert_response(tx, primary, notice, now)

    def _tell_too_far(self, tx: Tx, primary: Row, refused: Sequence[MessageDraft], now: int) -> None:
        """Tell the chat a chain started from, once per chain, that a handoff went past ``max_hops`` and
        was not passed on (in the completion's transaction: a re-run cannot tell it twice). The ref is the
        message whose reply asked for the handoff (its ``chain_handoff_refused`` event names it)."""
        origin, root = _user_origin(refused[0]), _chain_root(refused[0])
        if origin is None or (root is not None and not first_hops_refusal(tx, root, now)):
            return
        agent = refused[0].from_agent or str(primary["agent"])
        targets = list(dict.fromkeys(d.agent for d in refused))
        notice = ResponseDraft.to(
            origin,
            handoff_refused_notice(agent, targets, self.config.max_hops, str(primary["message_id"])),
            metadata={"kind": "refused_notice", "agent": agent},
        )
        self.responses.insert_response(tx, primary, notice, now)

    def mark_run_started(
        self, message_ids: Sequence[str], worker: str, *, also: TxWork | None = None
    ) -> None:
        """Record that a run containing these claimed messages starts now: from here a crash of the
        worker costs them an interrupted run (see :meth:`~shared.queue.failures.Failures.recover_stale_messages`); before, nothing.
        ``also(tx)`` runs in the same transaction (the run's status record and start event).

        Raises :class:`LeaseLost` (changing nothing) when the worker no longer holds every message.
        """
        now = now_ms()
        with self.db.transaction() as tx:
            take_group(tx, message_ids, worker, q.START_RUN, {"now": now}, q.START_RUN_RETURNS)
            if also is not None:
                also(tx)

    def claim_chat_into_run(
        self, agent: str, worker: str, chat: ChatAddress, run_id: str, *, lease_ms: int | None = None
    ) -> list[QueuedMessage]:
        """Claim the messages of ``chat`` for ``agent`` that became available while ``worker`` runs that
        chat's group (run ``run_id``), oldest first, already marked as started in that run: the ``steer``
        busy policy hands them to the run going on (``workers/steer.py``), so from here a crash costs them an
        interrupted run, like the run's own messages.

        Returns ``[]`` (changing nothing) when nothing of that chat is available or the worker no longer
        holds the agent's lease. A read comes first, so the run's watch can ask every check for nothing.
        """
        now = now_ms()
        values: dict[str, Any] = {
            "agent": agent,
            "worker": worker,
            "channel": chat.channel,
            "conv": chat.chat,
            "now": now,
        }
        if self.db.read_scalar(q.CHAT_WAITING, values) is None:
            return []
        values["lease"] = lease = now + (lease_ms or self.config.lease_ms)
        with self.db.transaction() as tx:
            held = tx.execute(lq.RENEW_LIVE, values).rowcount
            if held != 1:
                return []
            names, rows = tx.tuples(q.CLAIM_CHAT_INTO_RUN, values)
            if not rows:
                return []
            rows.sort(key=_first)
            ids = [str(r[1]) for r in rows]
            payload = {
                "agent": agent,
                "worker": worker,
                "message_ids": ids,
                "run_id": run_id,
                "steered": True,
            }
            append_events(tx, [PendingEvent("message_claimed", payload, ids[0])], now)
        return _claimed_messages(names, rows, agent, worker, now, lease, started=now)


def _first(row: Sequence[Any]) -> Any:
    return row[0]


@lru_cache(maxsize=64)
def _complete_statement(dialect: Dialect, count: int) -> str:
    """The one-statement completion of a group of ``count`` message ids (``:m0`` …, as :func:`sql_in` names
    them), built once per size."""
    ctes = q.complete_ctes(count)
    return dialect.write_with_events(ctes, q.COMPLETED_EVENT, ["events", "responses"], q.COMPLETE_RESULT)


def _claimed_messages(
    names: Sequence[str],
    rows: Sequence[Sequence[Any]],
    agent: str,
    worker: str,
    now: int,
    lease: int,
    *,
    started: int | None = None,
) -> list[QueuedMessage]:
    """The claimed messages from the claim's ``RETURNING`` tuples (in id order) and what the claim set
    (``started``: the run they were claimed into started then, see :meth:`Messages.claim_chat_into_run`)."""
    claimed = {
        "agent": agent,
        "status": MessageStatus.PROCESSING,
        "claimed_by": worker,
        "lease_until": lease,
        "updated_at": now,
        "run_started_at": started,
    }
    return [QueuedMessage.from_claim(names, r, claimed) for r in rows]


#: The columns of CLAIM_RETURNS, in order (the one-statement claims read no column descriptions).
_CLAIM_NAMES = tuple(name.strip() for name in q.CLAIM_RETURNS.split(","))


def _user_origin(draft: MessageDraft) -> ChatAddress | None:
    """The user chat a handoff's chain started from; None for chains agentpost started itself."""
    origin = draft.metadata.get("origin")
    if not isinstance(origin, Mapping) or not origin.get("channel") or origin["channel"] in INTERNAL_CHANNELS:
        return None
    return ChatAddress.of(origin)


def _chain_root(draft: MessageDraft) -> str | None:
    """The user message a handoff's chain started from (its run budget is counted against it)."""
    origin = draft.metadata.get("origin")
    root = origin.get("message_id") if isinstance(origin, Mapping) else None
    return str(root) if root else None


def take_group(
    tx: Tx,
    message_ids: Sequence[str],
    worker: str,
    assignments: str = "",
    values: dict[str, Any] | None = None,
    columns: str = "*",
) -> list[Row]:
    """The rows of a group this worker still holds (their ``columns``, which must include ``id``), oldest
    first; with ``assignments`` (``col = :v, …``) they are updated in the same statement. Raises
    :class:`LeaseLost` when the worker lost any of them (the caller's transaction then rolls back, so
    nothing changed)."""
    if not message_ids:
        raise InvalidInput("no message ids given")
    _, params = _in("m", list(message_ids))
    sql = q.held_group(len(message_ids), assignments, columns)
    rows = tx.rows(sql, {"worker": worker, **params, **(values or {})})
    if len(rows) != len(set(message_ids)):
        raise LeaseLost(
            f"worker {worker} no longer holds {len(set(message_ids)) - len(rows)} of {len(message_ids)} messages"
        )
    rows.sort(key=lambda r: int(r["id"]))
    return rows
