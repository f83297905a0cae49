"""Pairings of chat senders with a channel, as stored in the ``pairings`` table: the one owner of its SQL.

Channels decide who needs a code (:mod:`adapters.pairing`, with :func:`find`, :func:`pending_since` and
:func:`issue_code` inside its transaction); operators approve or revoke from the CLI or the web API, which is
why the storage lives here, where every process kind may use it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.storage.db import Database, Row, Tx
from shared.storage.queries import pairings as q
from shared.storage.statuses import PairingStatus

#: How long a pairing code approves its sender.
CODE_TTL_MS = 3_600_000


class PairingError(LookupError):
    """An approve or revoke that matched nothing (the message says why)."""


@dataclass(frozen=True)
class Pairing:
    """One row of ``pairings``."""

    channel: str
    sender_id: str
    sender: str
    code: str
    status: str
    created_at: int
    approved_at: int | None

    @classmethod
    def from_row(cls, row: Row) -> Pairing:
        return cls(
            channel=str(row["channel"]),
            sender_id=str(row["sender_id"]),
            sender=str(row["sender"]),
            code=str(row["code"]),
            status=str(row["status"]),
            created_at=int(row["created_at"]),
            approved_at=None if row["approved_at"] is None else int(row["approved_at"]),
        )

    def expired(self, now: int, ttl_ms: int = CODE_TTL_MS) -> bool:
        """A pending code older than the time to live no longer approves anyone."""
        return self.status == PairingStatus.PENDING and now - self.created_at > ttl_ms


def approve(db: Database, code: str, *, ttl_ms: int = CODE_TTL_MS, now: int | None = None) -> Pairing:
    """Approve the pending pairing with ``code`` (case-insensitive). Raises PairingError when no valid
    pending code matches (unknown, already used or expired)."""
    now = now_ms() if now is None else now
    wanted = code.strip().upper()
    with db.transaction() as tx:
        row = tx.one(q.PENDING_BY_CODE_LOCKED, {"code": wanted})
        if row is None:
            raise PairingError(f"no pending pairing has code {wanted!r}")
        found = Pairing.from_row(row)
        if found.expired(now, ttl_ms):
            raise PairingError(
                f"pairing code {wanted} expired; the sender gets a new one on their next message"
            )
        tx.execute(q.APPROVE, {"now": now, "c": found.channel, "s": found.sender_id})
        tx.signal("messages")  # wakes the channel, which then answers the messages kept for the sender
        append_events(
            tx,
            [
                PendingEvent(
                    "pairing_approved",
                    {"channel": found.channel, "sender_id": found.sender_id},
                    topic="channels",
                )
            ],
            now,
        )
    return Pairing(
        found.channel, found.sender_id, found.sender, found.code, "approved", found.created_at, now
    )


def revoke(db: Database, channel: str, sender_id: str, *, now: int | None = None) -> Pairing:
    """Revoke a sender's pairing (approved or pending); their next message needs a new approval."""
    now = now_ms() if now is None else now
    with db.transaction() as tx:
        found = find(tx, channel, sender_id)
        if found is None or found.status == "revoked":
            raise PairingError(f"sender {sender_id!r} is not paired with channel {channel!r}")
        tx.execute(q.REVOKE, {"c": channel, "s": sender_id})
        append_events(
            tx,
            [PendingEvent("pairing_revoked", {"channel": channel, "sender_id": sender_id}, topic="channels")],
            now,
        )
    return dataclasses.replace(found, status="revoked")


def list_pairings(db: Database, channel: str | None = None) -> list[Pairing]:
    """Every pairing (of one channel, or all), newest first."""
    if channel is None:
        rows = db.read(q.ALL_NEWEST_FIRST)
    else:
        rows = db.read(q.OF_CHANNEL_NEWEST_FIRST, {"c": channel})
    return [Pairing.from_row(r) for r in rows]


def is_approved(db: Database, channel: str, sender_id: str) -> bool:
    """Whether the sender is paired with the channel now (a read without a transaction)."""
    status = db.read_scalar(q.STATUS, {"c": channel, "s": sender_id})
    return bool(status == PairingStatus.APPROVED)


def find(tx: Tx, channel: str, sender_id: str) -> Pairing | None:
    """The sender's pairing row on the channel (any status), read inside ``tx``; ``None`` when they never
    asked."""
    row = tx.one(q.FIND, {"c": channel, "s": sender_id})
    return None if row is None else Pairing.from_row(row)


def pending_since(tx: Tx, channel: str, since: int) -> int:
    """How many codes of the channel are pending and were issued at or after ``since`` (epoch ms)."""
    return int(tx.scalar(q.PENDING_SINCE, {"c": channel, "since": since}) or 0)


def issue_code(tx: Tx, channel: str, sender_id: str, sender: str, code: str, now: int) -> None:
    """Give the sender a new pending ``code`` (replacing an expired code or a revoked pairing) and report
    ``pairing_requested``, inside ``tx``."""
    tx.execute(q.ISSUE, {"c": channel, "s": sender_id, "n": sender, "code": code, "now": now})
    append_events(
        tx,
        [
            PendingEvent(
                "pairing_requested",
                {"channel": channel, "sender_id": sender_id, "sender": sender},
                topic="channels",
            )
        ],
        now,
    )
