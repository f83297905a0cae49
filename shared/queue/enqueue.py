"""Enqueue: a message into the queue as ``pending``, with its event, in one transaction (one statement on
PostgreSQL) — routing, validation, dedupe on the message id and the platform id, and the debounce of a burst.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events, encode_payload
from shared.ids import is_message_id, new_id
from shared.queue.records import (
    CHANNEL_RE,
    INTERNAL_CHANNELS,
    MAX_MESSAGE_CHARS,
    Directory,
    EnqueueResult,
    InvalidInput,
    MessageDraft,
    TxWork,
)
from shared.queue.records import to_json as _json
from shared.settings.routing import AGENT_NAME_RE
from shared.storage.db import Database, Row, Tx
from shared.storage.queries import enqueue as q


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


#: How often an enqueue draws a new random id when the one drawn is already taken (41 random bits: with a
#: million messages kept, one enqueue in 2.8 million meets an older id once; twice in a row practically never).
_REDRAWS = 3


#: Channel names an enqueue has found well-formed (a few, bounded): the next enqueue on one skips the pattern
#: match, which costs as much as building the chat address the enqueue is given.
_GOOD_CHANNELS: set[str] = set()


def _duplicate_keys(params: dict[str, Any]) -> dict[str, Any]:
    return {"m": params["message_id"], "c": params["channel"], "e": params["external_id"]}


class Intake:
    """Putting messages into the queue (user messages, heartbeats, and the drafts a completion queues): the
    part ``Queue.intake``, routing by ``directory``."""

    def __init__(self, db: Database, directory: Directory) -> None:
        self.db = db
        self.directory = directory

    # -- enqueue -----------------------------------------------------------------------------------------
    def _draft_params(
        self,
        *,
        chat: ChatAddress,
        message: str,
        message_id: str | None,
        agent: str | None,
        from_agent: str | None,
        metadata: Mapping[str, Any] | None,
        hops: int,
        external_id: str | None,
        available_at: int | None,
        prefix: str | None,
        now: int,
    ) -> tuple[dict[str, Any], bool]:
        channel = chat.channel
        if not isinstance(message, str) or not message.strip():
            raise InvalidInput("message is empty")
        if len(message) > MAX_MESSAGE_CHARS:
            raise InvalidInput(f"message is longer than {MAX_MESSAGE_CHARS} characters")
        if channel not in _GOOD_CHANNELS:
            if not isinstance(channel, str) or not CHANNEL_RE.match(channel):
                raise InvalidInput(f"channel {channel!r} must match {CHANNEL_RE.pattern}")
            if len(_GOOD_CHANNELS) < 256:
                _GOOD_CHANNELS.add(channel)
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
            "sender": chat.sender or "",
            "sender_id": chat.sender_id or "",
            "message": message,
            "agent": route.agent,
            "from_agent": from_agent,
            "conversation": chat.conversation or "",
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
        """Insert a message row with its event in ``tx``; None when it is a duplicate (see
        :meth:`_redrawing` for ``drawn_id``)."""
        new_row = tx.insert(q.INSERT_MESSAGE, params)
        if new_row is None and drawn_id is not None:
            # Only a conflict needs the redraw (and its closure): the usual enqueue inserts at once.
            new_row = self._redrawing(
                new_row, lambda: tx.insert(q.INSERT_MESSAGE, params), params, drawn_id, tx.scalar
            )
        if new_row is None:
            return None
        append_events(tx, self._enqueue_events(params, named), params["now"])
        tx.signal("messages")
        return int(new_row)

    def _insert_in_one_statement(
        self, params: dict[str, Any], named: bool, drawn_id: str | None
    ) -> int | None:
        """:meth:`_insert_message` as the dialect's one-statement enqueue (a transaction by itself, one round
        trip): the same rows, events and wake-ups. None when it is a duplicate."""
        events = self._enqueue_events(params, named)
        sql = self.db.dialect.enqueue_statement(q.INSERT_MESSAGE_RETURNING, len(events))
        encoded: dict[str, Any] = {}
        for i, event in enumerate(events):
            encoded[f"ev_topic{i}"], encoded[f"ev_type{i}"] = event.topic, event.type
            encoded[f"ev_payload{i}"] = encode_payload(event.payload)

        def insert() -> int | None:
            # The event rows take the message id from the inserted row, so a redrawn id reaches them too.
            rows = self.db.write_statement(sql, {**params, **encoded}, {"messages", "events"})
            return int(rows[0]["id"]) if rows else None

        return self._redrawing(insert(), insert, params, drawn_id, self.db.read_scalar)

    @staticmethod
    def _redrawing(
        new_row: int | None,
        insert: Callable[[], int | None],
        params: dict[str, Any],
        drawn_id: str | None,
        scalar: Callable[[str, dict[str, Any]], Any],
    ) -> int | None:
        """After a first ``insert`` (of the message in ``params``) that returned ``new_row``: the new row's
        id, or None when nothing was inserted. ``drawn_id``: the id was drawn at random with this prefix, so a
        conflict on it alone (the platform id, read with ``scalar``, is not queued) is a chance meeting with an
        older message, not a duplicate: a fresh id is drawn and the insert runs again (the message would
        otherwise be dropped as "already queued")."""
        for _ in range(_REDRAWS if drawn_id is not None else 0):
            external = params["external_id"]
            if new_row is not None or (
                external is not None
                and scalar(q.PLATFORM_ID_QUEUED, {"c": params["channel"], "e": external}) is not None
            ):
                break
            params["message_id"] = new_id(str(drawn_id))
            new_row = insert()
        return new_row

    @staticmethod
    def _result(params: dict[str, Any], row_id: int | None, existing: Row | None) -> EnqueueResult:
        """What an enqueue reports: the new row, or the queued message it duplicates (``existing``)."""
        if row_id is None and existing is not None:
            return EnqueueResult(existing["message_id"], existing["agent"], True, int(existing["id"]))
        return EnqueueResult(params["message_id"], params["agent"], row_id is None, row_id)

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
        chat: ChatAddress,
        message: str,
        *,
        message_id: str | None = None,
        agent: str | None = None,
        from_agent: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        hops: int = 0,
        external_id: str | None = None,
        available_at: int | None = None,
        prefix: str | None = None,
        debounce_ms: int = 0,
        also: TxWork | None = None,
    ) -> EnqueueResult:
        """Queue one incoming message from ``chat`` as ``pending`` and wake the processor.

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
            chat=chat,
            message=message,
            message_id=message_id,
            agent=agent,
            from_agent=from_agent,
            metadata=metadata,
            hops=hops,
            external_id=external_id,
            available_at=available_at,
            prefix=prefix,
            now=now,
        )
        drawn_id = (prefix or chat.channel) if message_id is None else None
        # The plain enqueue (no debounce, nothing added to the transaction) is one statement where the
        # dialect has one (PostgreSQL: one round trip instead of three); the same rows, events and wake-ups.
        if also is None and slide_to is None and self.db.dialect.single_statement_writes:
            row_id = self._insert_in_one_statement(params, explicit, drawn_id)
            existing = None if row_id is not None else self.db.read(q.DUPLICATE_OF, _duplicate_keys(params))
            return self._result(params, row_id, existing[0] if existing else None)
        with self.db.transaction() as tx:
            row_id = self._insert_message(tx, params, explicit, drawn_id=drawn_id)
            if also is not None:
                also(tx)
            if row_id is not None and slide_to is not None:
                # A burst: another message of this chat is still waiting for the agent, so all of them
                # (this one too) wait until the window after the newest closes; each new one slides it.
                # A lone message stays available at once: a quiet chat never waits for a debounce.
                keys = {"agent": params["agent"], "channel": chat.channel, "conversation": chat.conversation}
                if tx.scalar(q.OTHER_WAITING, {**keys, "id": row_id}) is not None:
                    tx.execute(q.SLIDE_WAITING, {**keys, "at": slide_to})
            found = None if row_id is not None else tx.one(q.DUPLICATE_OF, _duplicate_keys(params))
        return self._result(params, row_id, found)

    def insert_drafts(self, tx: Tx, drafts: Sequence[MessageDraft], now: int | None = None) -> list[str]:
        """Queue ``drafts`` inside the caller's transaction (so they land together with the caller's other
        writes, or not at all); returns the new message ids."""
        at = now_ms() if now is None else now
        return [m for m in (self.insert_draft(tx, d, at) for d in drafts) if m is not None]

    def insert_draft(self, tx: Tx, draft: MessageDraft, now: int) -> str | None:
        """Queue one draft inside ``tx`` (a completion's handoff); its new message id, None when it was a
        duplicate."""
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
