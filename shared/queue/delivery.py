"""Outgoing responses: claimed with a lease per channel, delivered chunk by chunk, acked — or failed.

Responses move ``pending → delivering → acked``, or to ``failed`` when the platform refuses them for good
(``last_error`` holds the platform's reason). A claim takes only the *oldest unfinished* response of each
chat (channel + conversation), so within a chat replies go out in order and one at a time: a later reply
never overtakes an earlier one that is pending, backing off, or being delivered by another process, and
the response of a deliverer that died (lease expired) is taken again before anything after it. Responses
without a conversation address are not a chat and are not ordered.

Deliverers are named ``host:pid:start`` (:mod:`shared.worker_identity`). A response held by a deliverer of
this host whose process is gone (killed, crashed, its pid reused) is free at once — a restarted adapter picks
up its predecessor's half-sent replies in its first claim instead of waiting out the lease. A holder on
another host, or one whose id is of another form, is judged by its lease alone.

A transient send error puts the response back to ``pending`` with ``lease_until`` as the time it may be
tried again (its attempts are counted in ``kv``); it holds up only its own chat.

Small delivery records live in ``kv`` and are written in the same transaction as the change they follow:

- ``delivery_attempts`` / response id: transient failures so far;
- ``sent:<channel>`` / platform message id: the response a sent chunk belongs to (a platform that reports
  a failure later, such as WhatsApp's ``failed`` status, names only its own message id);
- ``undelivered:<channel>:<conversation>`` / response id: a failed reply the user has not yet been told
  about (JSON: when, why in plain words, the message id).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.backoff import Backoff
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.ids import new_id
from shared.queue.records import (
    CHANNEL_RE,
    InvalidInput,
    NotFound,
    QueuedResponse,
    ResponseDraft,
)
from shared.queue.records import to_json as _json
from shared.settings.model import QueueSettings
from shared.settings.routing import AGENT_NAME_RE
from shared.storage import kv
from shared.storage.db import Database, Row, Tx
from shared.storage.kv import Scope, scoped
from shared.storage.queries import responses as q

# shared.queue.messages writes its one-statement completion's reply with these columns.
from shared.storage.statuses import ResponseStatus
from shared.worker_identity import Holder, holder_state

#: Delivery records (platform ids, notices owed) older than this are removed by :meth:`Responses.prune_delivery_records`.
DELIVERY_RECORD_TTL_MS = 8 * 24 * 3600 * 1000


def _notice_scope(chat: ChatAddress) -> str:
    """The scope of the notices one chat is owed (family :attr:`Scope.UNDELIVERED`, by channel and
    conversation)."""
    return scoped(Scope.UNDELIVERED, f"{chat.channel}:{chat.conversation}")


@dataclass(frozen=True)
class UndeliveredNotice:
    """A failed reply its chat has not been told about yet."""

    response_id: int
    message_id: str
    created_at: int
    explanation: str


@dataclass(frozen=True)
class RetryOutcome:
    """What :meth:`Responses.retry_response_later` did: attempts so far, when it is due, or that it
    failed for good (attempts used up)."""

    attempts: int
    due: int
    failed: bool


class Responses:
    """The outbox, the part ``Queue.responses``: replies queued, claimed per channel, delivered chunk by
    chunk, retried, acked or failed, and the delivery records kept with them."""

    def __init__(self, db: Database, config: QueueSettings) -> None:
        self.db = db
        self.config = config

    def _gone_response_holders(self, channel: str, now: int) -> list[str]:
        """Workers of this host that hold responses of ``channel`` under a running lease but no longer run
        (their process is gone or its pid was reused): their responses need not wait for the lease."""
        rows = self.db.read(q.HOLDERS_UNDER_LEASE, {"channel": channel, "now": now})
        return sorted(str(r["claimed_by"]) for r in rows if holder_state(str(r["claimed_by"])) is Holder.GONE)

    def insert_response(self, tx: Tx, primary: Row, draft: ResponseDraft, now: int) -> int:
        """Queue ``draft`` inside ``tx`` as the reply to ``primary`` (the message row it answers: what the
        draft leaves unset is taken from it); returns the response's row id."""
        new_id = tx.insert(
            q.INSERT,
            {
                "message_id": primary["message_id"],
                "channel": draft.channel or primary["channel"],
                "sender": primary["sender"] if draft.sender is None else draft.sender,
                "sender_id": primary["sender_id"] if draft.sender_id is None else draft.sender_id,
                "message": draft.message,
                "original_message": primary["message"],
                "agent": primary["agent"],
                "files": _json(list(draft.files)),
                "metadata": _json(dict(draft.metadata)),
                "conversation": primary["conversation"] if draft.conversation is None else draft.conversation,
                "now": now,
            },
        )
        if new_id is None:  # responses have no unique key besides id: an INSERT always adds its row
            raise RuntimeError("the response row was not inserted")
        return new_id

    def note_in(self, tx: Tx, message_id: str, agent: str, draft: ResponseDraft) -> int:
        """Queue ``draft`` (addressed to a chat) as a note about ``message_id`` inside the caller's
        transaction, so it commits with the caller's write and, written before it, goes out first."""
        now = now_ms()
        about = {
            "message_id": message_id,
            "channel": draft.channel,
            "sender": "",
            "sender_id": "",
            "message": "",
            "agent": agent,
            "conversation": "",
        }
        rid = self.insert_response(tx, about, draft, now)
        payload = {"response_id": rid, "channel": draft.channel, "agent": agent, "note": True}
        append_events(tx, [PendingEvent("response_ready", payload, message_id)], now)
        tx.signal("responses")
        return rid

    def claim_responses_for_channel(
        self, channel: str, worker: str, *, limit: int = 10, lease_ms: int | None = None
    ) -> list[QueuedResponse]:
        """Claim up to ``limit`` undelivered responses of a channel, at most one per chat: the oldest
        unfinished one of each chat, when it is free (pending and due, or its deliverer's lease expired)."""
        now = now_ms()
        probe = self.db.read_scalar(q.CLAIMABLE, {"channel": channel, "now": now})
        # A deliverer of this host that died (kill -9, a crash) left its responses under a running lease;
        # its successor takes them at once instead of waiting the lease out. Holders on other hosts, or
        # alive, are judged by the lease alone. Liveness is read here, before the write lock is taken.
        gone = self._gone_response_holders(channel, now)
        if probe is None and not gone:
            return []
        lease = now + (lease_ms or self.config.lease_ms)
        params: dict[str, Any] = {
            "worker": worker,
            "lease": lease,
            "now": now,
            "channel": channel,
            "limit": max(1, limit),
        }
        sql = q.CLAIM
        if gone:
            sql = q.claim_taking_over(len(gone))
            params.update({f"gone{i}": name for i, name in enumerate(gone)})
        with self.db.transaction() as tx:
            rows = tx.rows(sql, params)
        return sorted((QueuedResponse.from_row(r) for r in rows), key=lambda r: r.id)

    def mark_chunk_delivered(
        self,
        response_id: int,
        worker: str,
        chunk_index: int,
        *,
        lease_ms: int | None = None,
        platform_id: str | None = None,
        ack: bool = False,
        also: Callable[[Tx], None] | None = None,
    ) -> bool:
        """Record that chunk ``chunk_index`` (0-based) was sent, so a restart resumes after it. With
        ``platform_id`` (the platform's id of the sent message) also remember which response it belongs to.
        With ``ack`` (the last chunk) the response is acknowledged in the same transaction, and ``also(tx)``
        runs in it too (the adapter's own record of the reply), so a delivered reply costs one write.

        Returns False (changing nothing) when the worker no longer holds the response or the chunk was
        already recorded.
        """
        now = now_ms()
        with self.db.transaction() as tx:
            row = tx.one(
                q.MARK_CHUNK_DELIVERED,
                {
                    "next": chunk_index + 1,
                    "lease": now + (lease_ms or self.config.lease_ms),
                    "now": now,
                    "id": response_id,
                    "worker": worker,
                    "index": chunk_index,
                },
            )
            if row is None:
                return False
            mid = row["message_id"]
            if platform_id:
                kv.put(tx, scoped(Scope.SENT, str(row["channel"])), platform_id, str(response_id), now)
            events = [
                PendingEvent("chunk_delivered", {"response_id": response_id, "chunk": chunk_index}, mid)
            ]
            if ack:
                self._ack_in(tx, response_id, worker, now)
                events.append(PendingEvent("response_acked", {"response_id": response_id}, mid))
            append_events(tx, events, now)
            if also is not None:
                also(tx)
        return True

    def ack_response(self, response_id: int, worker: str | None = None) -> bool:
        """Mark a response delivered. With ``worker``, only if that worker holds it. Idempotent."""
        now = now_ms()
        with self.db.transaction() as tx:
            mid = self._ack_in(tx, response_id, worker, now)
            if mid is None:
                exists = tx.scalar(q.STATUS, {"id": response_id})
                if exists is None:
                    raise NotFound(f"no response with id {response_id}")
                if exists == ResponseStatus.ACKED and worker is None:
                    # Acked already (e.g. by the scheduler for an unserved channel): whoever acked it, its
                    # attempt count has no reader any more.
                    kv.delete(tx, Scope.DELIVERY_ATTEMPTS, str(response_id))
                    return True
                return False
            append_events(tx, [PendingEvent("response_acked", {"response_id": response_id}, mid)], now)
        return True

    def _ack_in(self, tx: Tx, response_id: int, worker: str | None, now: int) -> str | None:
        """The ack itself: the response's message id, or None when it was not acked (failed responses stay
        failed: an ack arriving late must not turn them into "delivered")."""
        row = tx.one(
            q.ACK if worker is None else q.ACK_HELD, {"now": now, "id": response_id, "worker": worker}
        )
        if row is None:
            return None
        kv.delete(tx, Scope.DELIVERY_ATTEMPTS, str(response_id))
        return str(row["message_id"])

    def renew_response_lease(self, response_id: int, worker: str, *, lease_ms: int | None = None) -> bool:
        """Extend the lease of a response this worker is delivering (a slow send must not look dead)."""
        now = now_ms()
        with self.db.transaction() as tx:
            n = tx.execute(
                q.RENEW_LEASE,
                {"lease": now + (lease_ms or self.config.lease_ms), "id": response_id, "worker": worker},
            ).rowcount
        return bool(n)

    def retry_response_later(
        self,
        response_id: int,
        worker: str,
        error: str,
        *,
        base_ms: int,
        max_ms: int,
        max_attempts: int | None = None,
        explanation: str | None = None,
        count: bool = True,
    ) -> RetryOutcome | None:
        """Give a response back after a transient send error: ``pending`` again, due after an exponential
        backoff (``base_ms`` doubled per attempt, at most ``max_ms``, with jitter), resuming at its first
        unsent chunk. Only its own chat waits. Once ``max_attempts`` transient errors have been counted it
        is failed instead (as :meth:`fail_response`, with ``explanation``). With ``count=False`` (a clean
        shutdown) it is due at once and costs no attempt.

        Returns what happened, or None when the worker no longer holds the response.
        """
        now = now_ms()
        with self.db.transaction() as tx:
            # Locked (PostgreSQL): a takeover racing this waits, or has happened and the row is not held.
            held = tx.one(q.HELD_LOCKED, {"id": response_id, "worker": worker})
            if held is None:
                return None
            attempts = int(kv.get(tx, Scope.DELIVERY_ATTEMPTS, str(response_id)) or 0)
            if not count:
                tx.execute(q.GIVE_BACK, {"now": now, "id": response_id})
                tx.signal("responses")
                return RetryOutcome(attempts, now, failed=False)
            attempts += 1
            if max_attempts is not None and attempts >= max_attempts:
                reason = f"gave up after {attempts} attempts: {error}"
                _fail_in_tx(tx, response_id, reason, explanation, now)
                return RetryOutcome(attempts, now, failed=True)
            kv.put(tx, Scope.DELIVERY_ATTEMPTS, str(response_id), str(attempts), now)
            due = now + Backoff(base_ms / 1000, max_ms / 1000).delay_ms(attempts)
            tx.execute(
                q.RETRY_LATER,
                {"due": due, "now": now, "error": error[:1000], "id": response_id},
            )
            append_events(
                tx,
                [
                    PendingEvent(
                        "delivery_retry",
                        {
                            "response_id": response_id,
                            "attempts": attempts,
                            "error": error[:300],
                            "retry_at": due,
                        },
                        held["message_id"],
                    )
                ],
                now,
            )
            tx.signal("responses")
        return RetryOutcome(attempts, due, failed=False)

    def fail_response(
        self,
        response_id: int,
        reason: str,
        *,
        worker: str | None = None,
        explanation: str | None = None,
    ) -> bool:
        """Mark a response undeliverable for good (``failed``, with the platform's ``reason``); claims never
        take it again. With ``worker``, only while that worker delivers it; without (a platform reporting a
        failure later), also after it was acked. With ``explanation`` (plain words for the user) the chat is
        owed a notice, given the next time the user writes (:meth:`take_undelivered_notices`).

        Returns whether the response changed to failed.
        """
        now = now_ms()
        with self.db.transaction() as tx:
            return _fail_in_tx(tx, response_id, reason, explanation, now, worker)

    def response_for_platform_id(self, channel: str, platform_id: str) -> int | None:
        """The response a message this channel sent (by the platform's message id) belongs to."""
        value = kv.get(self.db, scoped(Scope.SENT, channel), platform_id)
        return None if value is None else int(value)

    def has_undelivered_notices(self, chat: ChatAddress) -> bool:
        """Whether ``chat`` is owed a notice about a failed reply (a cheap read, no write lock)."""
        return kv.any_in(self.db, _notice_scope(chat))

    def take_undelivered_notices(self, chat: ChatAddress) -> list[UndeliveredNotice]:
        """The failed replies ``chat`` has not been told about, oldest first, removed in a transaction of
        their own (:meth:`take_undelivered_notices_in` when the caller queues the notice)."""
        with self.db.transaction() as tx:
            return self.take_undelivered_notices_in(tx, chat)

    def take_undelivered_notices_in(self, tx: Tx, chat: ChatAddress) -> list[UndeliveredNotice]:
        """The failed replies ``chat`` has not been told about, oldest first, removed inside ``tx``: the
        caller queues the note in the same transaction, so a crash neither loses it (removed, not yet
        queued) nor tells it twice (queued, not yet removed)."""
        scope = _notice_scope(chat)
        rows = kv.entries(tx, scope)
        if not rows:
            return []
        kv.delete_scope(tx, scope)
        found = []
        for r in rows:
            try:
                record = json.loads(r.value)
                found.append(
                    UndeliveredNotice(
                        int(r.key),
                        str(record.get("message_id") or ""),
                        int(record.get("created_at") or 0),
                        str(record.get("explanation") or ""),
                    )
                )
            except (ValueError, TypeError, AttributeError):
                continue
        return sorted(found, key=lambda n: n.response_id)

    def failed_responses(self, *, since_ms: int = 0, limit: int = 100) -> list[QueuedResponse]:
        """Responses that could not be delivered (newest first), for operators."""
        rows = self.db.read(q.FAILED, {"since": since_ms, "limit": limit})
        return [QueuedResponse.from_row(r) for r in rows]

    def failed_response_count(self, *, since_ms: int = 0) -> int:
        """How many responses could not be delivered (failed since ``since_ms``)."""
        return int(self.db.read_scalar(q.FAILED_COUNT, {"since": since_ms}) or 0)

    def prune_delivery_records(self, channel: str, *, older_than_ms: int = DELIVERY_RECORD_TTL_MS) -> int:
        """Forget this channel's platform-id mappings and unanswered notices older than the retention."""
        cut = now_ms() - older_than_ms
        with self.db.transaction() as tx:
            n = kv.delete_older(tx, scoped(Scope.SENT, channel), cut)
            # Every chat of this channel: the notice scopes ``undelivered:<channel>:<conversation>``.
            n += kv.delete_older(tx, _notice_scope(ChatAddress(channel)), cut, family=True)
        return n

    def enqueue_response(
        self,
        chat: ChatAddress,
        message: str,
        *,
        agent: str = "",
        files: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        message_id: str | None = None,
        also: Callable[[Tx], None] | None = None,
    ) -> QueuedResponse:
        """Queue an outgoing message to ``chat`` that nobody asked for (a proactive message, a progress
        note). ``also(tx)``
        commits with it (an adapter's answer to a command, with the command's update marked seen)."""
        with self.db.transaction() as tx:
            response = self.enqueue_response_in(
                tx, chat, message, agent=agent, files=files, metadata=metadata, message_id=message_id
            )
            if also is not None:
                also(tx)
        return response

    def enqueue_response_in(
        self,
        tx: Tx,
        chat: ChatAddress,
        message: str,
        *,
        agent: str = "",
        files: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> QueuedResponse:
        """:meth:`enqueue_response` inside the caller's transaction, so the reply commits with the change it
        tells of (a ``/retry``'s effect, the removal of the notices it carries)."""
        if not isinstance(message, str) or not message.strip():
            raise InvalidInput("message is empty")
        channel = chat.channel
        if not CHANNEL_RE.match(channel):
            raise InvalidInput(f"channel {channel!r} must match {CHANNEL_RE.pattern}")
        if agent and not AGENT_NAME_RE.match(agent):
            raise InvalidInput(f"agent name {agent!r} must match {AGENT_NAME_RE.pattern}")
        now = now_ms()
        primary = {
            "message_id": message_id or new_id("proactive"),
            "channel": channel,
            "sender": chat.sender,
            "sender_id": chat.sender_id,
            "message": "",
            "agent": agent,
            "conversation": chat.conversation,
        }
        rid = self.insert_response(
            tx, primary, ResponseDraft(message=message, files=files, metadata=metadata or {}), now
        )
        append_events(
            tx,
            [
                PendingEvent(
                    "response_ready",
                    # The channel names who should deliver it (TinyAGI's channels wake on it).
                    {"response_id": rid, "proactive": True, "channel": channel, "agent": agent},
                    primary["message_id"],
                )
            ],
            now,
        )
        tx.signal("responses")
        row = tx.one(q.ROW, {"id": rid})
        assert row is not None
        return QueuedResponse.from_row(row)


def _fail_in_tx(
    tx: Tx,
    response_id: int,
    reason: str,
    explanation: str | None,
    now: int,
    worker: str | None = None,
) -> bool:
    """Fail the response inside ``tx``: with ``worker``, only while that worker delivers it."""
    row = tx.one(
        q.FAIL if worker is None else q.FAIL_HELD,
        {"reason": reason[:1000], "now": now, "id": response_id, "worker": worker},
    )
    if row is None:
        return False
    append_events(
        tx,
        [
            PendingEvent(
                "response_failed",
                {"response_id": response_id, "channel": row["channel"], "reason": reason[:300]},
                row["message_id"],
            )
        ],
        now,
    )
    kv.delete(tx, Scope.DELIVERY_ATTEMPTS, str(response_id))
    if explanation is not None and row["conversation"]:
        # The user knows their message by when they sent it (the reply's own time if the row is gone).
        asked = tx.scalar(q.MESSAGE_CREATED_AT, {"m": row["message_id"]})
        record = {
            "message_id": row["message_id"],
            "created_at": int(asked if asked is not None else row["created_at"]),
            "explanation": explanation,
        }
        kv.put(
            tx,
            _notice_scope(ChatAddress.of(row)),
            str(response_id),
            json.dumps(record, separators=(",", ":")),
            now,
        )
    return True
