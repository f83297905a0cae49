"""Every queue operation, implemented once for SQLite and PostgreSQL (TinyAGI's queue API names, in snake_case).

Messages move ``pending → processing → completed | dead``; responses ``pending → delivering → acked``.
Each operation is one transaction that also appends the events reporting it and signals waiting processes.
Workers hold leases (renewed while they run), and every write a worker makes is fenced by
``claimed_by``: a worker whose lease expired and whose messages were taken over cannot complete them twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.chain_budget import take_chain_run
from shared.chat_address import ChatAddress
from shared.clock import now_ms
from shared.db import Database, Row, Tx
from shared.events import PendingEvent, append_events, encode_payload
from shared.ids import is_message_id, new_id
from shared.queue_admin import AdminOps
from shared.queue_control import ControlOps
from shared.queue_failures import FailureOps, retry_edit_key
from shared.queue_leases import LeaseOps
from shared.queue_types import (
    CHANNEL_RE,
    CLAIM_RETURNS,
    INTERNAL_CHANNELS,
    MAX_MESSAGE_CHARS,
    AgentTurn,
    ChatPost,
    CompleteOutcome,
    Directory,
    EnqueueResult,
    FailOutcome,
    InvalidInput,
    LeaseLost,
    MessageDraft,
    NotFound,
    QueueConfig,
    QueuedMessage,
    QueuedResponse,
    QueueError,
    ResponseDraft,
    RetryBudgetExhausted,
    TxWork,
    group_by_conversation,
)
from shared.queue_types import to_json as _json
from shared.routing import AGENT_NAME_RE
from shared.settings import Settings


class UnknownMention(InvalidInput):
    """A user's message starts with ``@name`` and no agent or team has that name: it is not queued (it
    would silently reach the default agent); the chat answers with the names it knows (``agents``,
    ``teams``)."""

    def __init__(self, name: str, agents: Sequence[str], teams: Sequence[str]) -> None:
        self.name, self.agents, self.teams = name, list(agents), list(teams)
        listed = f"agents: {', '.join('@' + a for a in agents) or 'none'}"
        if teams:
            listed += f"; teams: {', '.join('@' + t for t in teams)}"
        super().__init__(f"@{name} is not an agent or team here ({listed})")


__all__ = [
    "INTERNAL_CHANNELS",
    "AgentTurn",
    "ChatPost",
    "CompleteOutcome",
    "Directory",
    "EnqueueResult",
    "FailOutcome",
    "InvalidInput",
    "LeaseLost",
    "MessageDraft",
    "NotFound",
    "Queue",
    "QueueConfig",
    "QueueError",
    "QueuedMessage",
    "QueuedResponse",
    "ResponseDraft",
    "RetryBudgetExhausted",
    "TxWork",
    "UnknownMention",
    "group_by_conversation",
    "retry_edit_key",
]

_MESSAGE_COLUMNS = (
    "message_id, channel, sender, sender_id, message, agent, from_agent, status, retry_count, "
    "created_at, updated_at, conversation, metadata, available_at, hops, external_id"
)
_INSERT_MESSAGE = (
    f"INSERT INTO messages ({_MESSAGE_COLUMNS}) VALUES (:message_id, :channel, :sender, :sender_id, "
    ":message, :agent, :from_agent, 'pending', 0, :now, :now, :conversation, :metadata, :available_at, "
    ":hops, :external_id) ON CONFLICT DO NOTHING"
)

#: The same INSERT as the head of the one-statement enqueue (shared.dialect.Dialect.enqueue_statement).
_INSERT_MESSAGE_RETURNING = _INSERT_MESSAGE + " RETURNING id, message_id"

#: How often an enqueue draws a new random id when the one drawn is already taken (41 random bits: with a
#: million messages kept, one enqueue in 2.8 million meets an older id once; twice in a row practically never).
_REDRAWS = 3
_PLATFORM_ID = "SELECT 1 FROM messages WHERE channel = :c AND external_id = :e"

#: What a completion reads of the group's first message, for the reply (the other rows give only their ids:
#: a group of 20 then converts 40 values instead of 160).
_PRIMARY = (
    "SELECT id, message_id, agent, channel, sender, sender_id, message, conversation FROM messages "
    "WHERE id = :id"
)

#: enqueue_message's debounce: another message of the same chat still waiting for the same agent.
_OTHER_WAITING = (
    "SELECT 1 FROM messages WHERE status = 'pending' AND agent = :agent AND channel = :channel "
    "AND conversation = :conversation AND id <> :id LIMIT 1"
)
#: ... and the burst's sliding window: every waiting message of the chat moves to the window's end.
_SLIDE_WAITING = (
    "UPDATE messages SET available_at = :at WHERE status = 'pending' AND agent = :agent "
    "AND channel = :channel AND conversation = :conversation AND available_at < :at"
)


class Queue(FailureOps, LeaseOps, AdminOps, ControlOps):
    """The queue operations over one :class:`~shared.db.Database`."""

    def __init__(
        self, db: Database, config: QueueConfig | None = None, directory: Directory | None = None
    ) -> None:
        self.db = db
        self.config = config or QueueConfig()
        self.directory = directory or Directory.single("assistant")
        #: The claim statement of :meth:`claim_all_pending_messages` (public so the schema tests can check its
        #: plan: the statement itself, not a copy of it).
        self.claim_sql = (
            "UPDATE messages SET status = 'processing', claimed_by = :worker, lease_until = :lease, "
            "updated_at = :now, run_started_at = NULL WHERE id IN (SELECT id FROM messages WHERE status = 'pending' AND agent = :agent "
            f"AND available_at <= :now ORDER BY id{db.dialect.skip_locked}) RETURNING {CLAIM_RETURNS}"
        )

    @classmethod
    def from_settings(cls, settings: Settings, db: Database) -> Queue:
        q = settings.queue
        config = QueueConfig(
            max_retries=q.max_retries,
            manual_retry_budget=q.manual_retry_budget,
            lease_ms=int(q.lease_seconds * 1000),
            backoff_base_ms=int(q.backoff_base_seconds * 1000),
            backoff_max_ms=int(q.backoff_max_seconds * 1000),
            max_hops=q.max_hops,
            max_interruptions=q.max_interrupted_runs,
            max_chain_runs=q.max_chain_runs,
            stall_ceiling_ms=int(q.stall_ceiling_seconds * 1000),
        )
        directory = Directory(
            agents=frozenset(settings.agents), teams=dict(settings.teams), default_agent=q.default_agent
        )
        return cls(db, config, directory)

    # -- enqueue -----------------------------------------------------------------------------------------
    def _draft_params(
        self,
        *,
        channel: str,
        sender: str,
        message: str,
        sender_id: str,
        message_id: str | None,
        agent: str | None,
        from_agent: str | None,
        conversation: str,
        metadata: Mapping[str, Any] | None,
        hops: int,
        external_id: str | None,
        available_at: int | None,
        prefix: str | None,
        now: int,
    ) -> tuple[dict[str, Any], bool]:
        if not isinstance(message, str) or not message.strip():
            raise InvalidInput("message is empty")
        if len(message) > MAX_MESSAGE_CHARS:
            raise InvalidInput(f"message is longer than {MAX_MESSAGE_CHARS} characters")
        if not isinstance(channel, str) or not CHANNEL_RE.match(channel):
            raise InvalidInput(f"channel {channel!r} must match {CHANNEL_RE.pattern}")
        if message_id is not None and not is_message_id(message_id):
            raise InvalidInput(
                f"message id {message_id!r} must look like prefix_xxxxxxxx (8 lowercase a-z0-9)"
            )
        if hops < 0:
            raise InvalidInput("hops must be zero or more")
        directory = self.directory
        routes = directory.routes
        if agent is not None:
            if agent not in directory.agents and agent not in directory.teams:
                if not AGENT_NAME_RE.match(agent):
                    raise InvalidInput(f"agent name {agent!r} must match {AGENT_NAME_RE.pattern}")
                known = ", ".join(sorted(directory.agents | set(directory.teams)))
                raise InvalidInput(f"unknown agent or team {agent!r} (known: {known})")
        elif channel not in INTERNAL_CHANNELS and from_agent is None:
            # A user addressed "@name" and nobody has that name: refused, not sent to the default agent.
            mentioned = routes.unknown_mention(message)
            if mentioned is not None:
                raise UnknownMention(mentioned, sorted(directory.agents), sorted(directory.teams))
        route = routes.resolve(message, agent)
        params = {
            "message_id": message_id or new_id(prefix or channel),
            "channel": channel,
            "sender": sender or "",
            "sender_id": sender_id or "",
            "message": message,
            "agent": route.agent,
            "from_agent": from_agent,
            "conversation": conversation or "",
            "metadata": _json(dict(metadata)) if metadata else "{}",
            "available_at": now if available_at is None else available_at,
            "hops": hops,
            "external_id": external_id,
            "now": now,
        }
        return params, route.explicit

    def _insert_message(
        self, tx: Tx, params: dict[str, Any], named: bool, *, drawn_id: str | None = None
    ) -> int | None:
        """Insert a message row with its event; None when it is a duplicate. ``drawn_id``: the id was drawn
        at random with this prefix, so a conflict on it alone is a chance meeting with an older message,
        not a duplicate: a fresh id is drawn (the message would otherwise be dropped as "already queued")."""
        new_row = tx.insert(_INSERT_MESSAGE, params)
        for _ in range(_REDRAWS if drawn_id is not None else 0):
            if new_row is not None or self._platform_id_taken(tx, params):
                break
            params["message_id"] = new_id(str(drawn_id))
            new_row = tx.insert(_INSERT_MESSAGE, params)
        if new_row is None:
            return None
        append_events(tx, self._enqueue_events(params, named), params["now"])
        tx.signal("messages")
        return int(new_row)

    def _enqueue_in_one_statement(
        self, params: dict[str, Any], explicit: bool, drawn_id: str | None
    ) -> EnqueueResult | None:
        """PostgreSQL: the plain enqueue (no debounce, nothing added to the transaction) as one statement,
        one round trip; the same rows, events and wake-ups as :meth:`_insert_message` (a random id that met
        an older message's is drawn again there too). None on SQLite."""
        if self.db.dialect.is_sqlite:
            return None
        events = self._enqueue_events(params, explicit)
        sql = self.db.dialect.enqueue_statement(_INSERT_MESSAGE_RETURNING, len(events))
        if sql is None:
            return None
        values = dict(params)
        for i, event in enumerate(events):
            values[f"ev_topic{i}"], values[f"ev_type{i}"] = event.topic, event.type
            values[f"ev_payload{i}"] = encode_payload(event.payload)
        rows = self.db.write_statement(sql, values, {"messages", "events"})
        for _ in range(_REDRAWS if drawn_id is not None else 0):
            if rows or self._existing_platform_id(params):
                break
            values["message_id"] = params["message_id"] = new_id(str(drawn_id))
            rows = self.db.write_statement(sql, values, {"messages", "events"})
        if rows:
            return EnqueueResult(params["message_id"], params["agent"], False, int(rows[0]["id"]))
        existing = self._existing(params)
        if existing is not None:
            return existing
        return EnqueueResult(params["message_id"], params["agent"], True, None)

    def _existing_platform_id(self, params: dict[str, Any]) -> bool:
        """True when the message's platform id (``channel``, ``external_id``) is already queued."""
        if params["external_id"] is None:
            return False
        found = self.db.read_scalar(_PLATFORM_ID, {"c": params["channel"], "e": params["external_id"]})
        return found is not None

    @staticmethod
    def _platform_id_taken(tx: Tx, params: dict[str, Any]) -> bool:
        """:meth:`_existing_platform_id` inside a transaction."""
        if params["external_id"] is None:
            return False
        return tx.scalar(_PLATFORM_ID, {"c": params["channel"], "e": params["external_id"]}) is not None

    def _existing(self, params: dict[str, Any]) -> EnqueueResult | None:
        """The queued message a duplicate enqueue refers to (same message id, or same platform id)."""
        found = self.db.read(
            "SELECT id, message_id, agent FROM messages WHERE message_id = :m OR (channel = :c AND external_id = :e)",
            {"m": params["message_id"], "c": params["channel"], "e": params["external_id"]},
        )
        if not found:
            return None
        row = found[0]
        return EnqueueResult(row["message_id"], row["agent"], True, int(row["id"]))

    @staticmethod
    def _enqueue_events(params: dict[str, Any], named: bool) -> list[PendingEvent]:
        """The one event an enqueue appends: ``message_received``, with ``"named": true`` when the sender
        chose the agent (an ``agent=`` or a mention) rather than falling back to the default agent."""
        payload: dict[str, Any] = {
            "channel": params["channel"],
            "sender": params["sender"],
            "agent": params["agent"],
        }
        if named:
            payload["named"] = True
        return [PendingEvent("message_received", payload, params["message_id"])]

    def enqueue_message(
        self,
        channel: str,
        sender: str,
        message: str,
        *,
        sender_id: str = "",
        message_id: str | None = None,
        agent: str | None = None,
        from_agent: str | None = None,
        conversation: str = "",
        metadata: Mapping[str, Any] | None = None,
        hops: int = 0,
        external_id: str | None = None,
        available_at: int | None = None,
        prefix: str | None = None,
        debounce_ms: int = 0,
        also: TxWork | None = None,
    ) -> EnqueueResult:
        """Queue one incoming message as ``pending`` and wake the processor.

        Routing: ``agent`` (an agent or team name) if given, else a leading ``@agent``/``@team`` mention,
        else the default agent; the text is kept intact. A ``message_id`` or ``(channel, external_id)``
        that is already queued is reported as ``duplicate`` and changes nothing.
        With ``debounce_ms``, a message to a quiet chat (nothing else of that chat waiting for that agent)
        is available at once, so a lone message costs no wait; once a second message of the chat is waiting,
        every waiting message of the chat becomes available only ``debounce_ms`` after the newest, so a
        burst of quick messages is one run (the window slides with each message of the burst).
        ``also(tx)`` runs in the same transaction whether or not the message was new (an adapter records
        the platform update as seen with it). Raises :class:`InvalidInput` (nothing changed) for an empty
        message or a bad name or id.
        """
        now = now_ms()
        if debounce_ms < 0:
            raise InvalidInput("debounce_ms must be zero or more")
        # The debounce window opens only when this message joins another waiting one (below).
        slide_to = now + debounce_ms if debounce_ms and available_at is None else None
        params, explicit = self._draft_params(
            channel=channel,
            sender=sender,
            message=message,
            sender_id=sender_id,
            message_id=message_id,
            agent=agent,
            from_agent=from_agent,
            conversation=conversation,
            metadata=metadata,
            hops=hops,
            external_id=external_id,
            available_at=available_at,
            prefix=prefix,
            now=now,
        )
        drawn_id = (prefix or channel) if message_id is None else None
        if also is None and slide_to is None:
            one = self._enqueue_in_one_statement(params, explicit, drawn_id)
            if one is not None:
                return one
        with self.db.transaction() as tx:
            row_id = self._insert_message(tx, params, explicit, drawn_id=drawn_id)
            if also is not None:
                also(tx)
            if row_id is not None and slide_to is not None:
                # A burst: another message of this chat is still waiting for the agent, so all of them
                # (this one too) wait until the window after the newest closes; each new one slides it.
                # A lone message stays available at once: a quiet chat never waits for a debounce.
                chat = {"agent": params["agent"], "channel": channel, "conversation": params["conversation"]}
                if tx.scalar(_OTHER_WAITING, {**chat, "id": row_id}) is not None:
                    tx.execute(_SLIDE_WAITING, {**chat, "at": slide_to})
            if row_id is None:
                existing = tx.one(
                    "SELECT id, message_id, agent FROM messages WHERE message_id = :m OR "
                    "(channel = :c AND external_id = :e)",
                    {"m": params["message_id"], "c": channel, "e": external_id},
                )
                if existing is not None:
                    return EnqueueResult(existing["message_id"], existing["agent"], True, int(existing["id"]))
        return EnqueueResult(params["message_id"], params["agent"], row_id is None, row_id)

    # -- claim ------------------------------------------------------------------------------------------
    def agents_with_pending(self, now: int | None = None) -> list[str]:
        """Agents with at least one message available now (read-only, takes no write lock)."""
        rows = self.db.read(
            "SELECT DISTINCT agent FROM messages WHERE status = 'pending' AND available_at <= :now",
            {"now": now_ms() if now is None else now},
        )
        return sorted(r["agent"] for r in rows)

    def next_available_at(self) -> int | None:
        """When the earliest pending message becomes available (for sleeping through a backoff)."""
        value = self.db.read_scalar("SELECT MIN(available_at) FROM messages WHERE status = 'pending'")
        return None if value is None else int(value)

    def claim_all_pending_messages(
        self, agent: str, worker: str, *, lease_ms: int | None = None
    ) -> list[QueuedMessage]:
        """Take the agent's lease and claim every available pending message of that agent, oldest first.

        Returns ``[]`` (changing nothing) when another worker holds the agent, the agent is paused, or
        nothing is available. The caller keeps the agent lease until :meth:`release_agent`.
        """
        now = now_ms()
        probe = self.db.read_scalar(
            "SELECT 1 FROM messages WHERE status = 'pending' AND agent = :agent AND available_at <= :now LIMIT 1",
            {"agent": agent, "now": now},
        )
        if probe is None:
            return []
        lease = now + (lease_ms or self.config.lease_ms)
        with self.db.transaction() as tx:
            if not self._take_agent(tx, agent, worker, now, lease):
                return []
            names, rows = tx.tuples(
                self.claim_sql, {"worker": worker, "lease": lease, "now": now, "agent": agent}
            )
            if not rows:
                self._release_agent(tx, agent, worker)
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
        claimed = {
            "agent": agent,
            "status": "processing",
            "claimed_by": worker,
            "lease_until": lease,
            "updated_at": now,
            "run_started_at": None,
        }
        return [QueuedMessage.from_claim(names, r, claimed) for r in rows]

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
        with self.db.transaction() as tx:
            rows = self._take_group(
                tx,
                message_ids,
                worker,
                "status = 'completed', updated_at = :now, lease_until = NULL",
                {"now": now},
                "id, message_id",
            )
            if also is not None:
                also(tx)  # first: the caller's events (the run's end) come before the reply's
            primary = tx.one(_PRIMARY, {"id": rows[0]["id"]})
            if primary is None:  # the row was updated by this transaction a moment ago
                raise RuntimeError(f"message {rows[0]['message_id']} vanished during its completion")
            ids = [r["message_id"] for r in rows]
            response_id: int | None = None
            events: list[PendingEvent] = []
            if response is not None:
                draft = ResponseDraft(message=response) if isinstance(response, str) else response
                response_id = self._insert_response(tx, primary, draft, now)
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
            released = release_when_idle and self._release_if_idle(tx, str(primary["agent"]), worker, now)
            # Last: on PostgreSQL the first event appended takes the event-order lock until the commit, and
            # every other writer's events wait for it.
            append_events(tx, events, now)
            tx.signal("responses")
        return CompleteOutcome(response_id, queued, refused, released)

    def _queue_followups(
        self, tx: Tx, primary: Row, followups: Sequence[MessageDraft], now: int, events: list[PendingEvent]
    ) -> tuple[list[str], int]:
        """Queue a completion's handoffs within ``max_hops`` and the chain's run budget; returns the new
        message ids and how many were refused (each refusal is an event)."""
        queued: list[str] = []
        refused = 0
        for draft_msg in followups:
            if draft_msg.hops > self.config.max_hops:
                refused += 1
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
            mid = self._insert_draft(tx, draft_msg, now)
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
        return queued, refused

    @staticmethod
    def _record_posts_and_history(
        tx: Tx, chat_posts: Sequence[ChatPost], history: Sequence[AgentTurn], now: int
    ) -> None:
        for post in chat_posts:
            tx.execute(
                "INSERT INTO chat_messages (team_id, from_agent, message, created_at) "
                "VALUES (:team, :agent, :message, :now)",
                {"team": post.team_id, "agent": post.from_agent, "message": post.message, "now": now},
            )
        for turn in history:
            tx.execute(
                "INSERT INTO agent_messages (agent_id, role, channel, sender, message_id, content, created_at) "
                "VALUES (:agent, :role, :channel, :sender, :mid, :content, :now)",
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
        origin = draft.metadata.get("origin") or {}
        if origin.get("channel") in INTERNAL_CHANNELS or not origin.get("channel"):
            return
        notice = ResponseDraft.to(
            ChatAddress.of(origin),
            f"The agents have used up the {self.config.max_chain_runs} runs one message may set off, so they "
            "stopped handing your request on to each other. Their answers so far are above; send a new "
            f"message to carry on. (ref {root})",
            metadata={"kind": "budget_notice", "agent": draft.from_agent or primary["agent"]},
        )
        self._insert_response(tx, primary, notice, now)

    def insert_drafts(self, tx: Tx, drafts: Sequence[MessageDraft], now: int | None = None) -> list[str]:
        """Queue ``drafts`` inside the caller's transaction (so they land together with the caller's other
        writes, or not at all); returns the new message ids."""
        at = now_ms() if now is None else now
        return [m for m in (self._insert_draft(tx, d, at) for d in drafts) if m is not None]

    def _insert_draft(self, tx: Tx, draft: MessageDraft, now: int) -> str | None:
        params = {
            "message_id": new_id(draft.prefix),
            "channel": draft.channel,
            "sender": draft.sender,
            "sender_id": draft.sender_id,
            "message": draft.message,
            "agent": draft.agent,
            "from_agent": draft.from_agent,
            "conversation": draft.conversation,
            "metadata": _json(dict(draft.metadata)),
            "available_at": now,
            "hops": draft.hops,
            "external_id": None,
            "now": now,
        }
        if self._insert_message(tx, params, draft.named, drawn_id=draft.prefix) is None:
            return None
        return str(params["message_id"])

    def mark_run_started(
        self, message_ids: Sequence[str], worker: str, *, also: TxWork | None = None
    ) -> None:
        """Record that a run containing these claimed messages starts now: from here a crash of the
        worker costs them an interrupted run (see :meth:`recover_stale_messages`); before, nothing.
        ``also(tx)`` runs in the same transaction (the run's status record and start event).

        Raises :class:`LeaseLost` (changing nothing) when the worker no longer holds every message.
        """
        now = now_ms()
        with self.db.transaction() as tx:
            self._take_group(tx, message_ids, worker, "run_started_at = :now", {"now": now}, "id")
            if also is not None:
                also(tx)


def _first(row: Sequence[Any]) -> Any:
    return row[0]


def _chain_root(draft: MessageDraft) -> str | None:
    """The user message a handoff's chain started from (its run budget is counted against it)."""
    origin = draft.metadata.get("origin")
    root = origin.get("message_id") if isinstance(origin, Mapping) else None
    return str(root) if root else None
