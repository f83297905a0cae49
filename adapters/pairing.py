"""Pairing of chat senders with a channel, over the ``pairings`` table.

A sender the channel does not know gets a one-time 8-character code, once; their messages are not queued.
An operator runs ``agentpost pairing approve CODE`` and from then on the sender's messages go through.
Codes expire after an hour (a later message gets a fresh code) and at most a few codes are pending per
channel at a time, so a flood of strangers cannot fill the table or the operator's list.

Rows: one per ``(channel, sender_id)``; ``status`` is ``pending``, ``approved`` or ``revoked``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

from shared.clock import now_ms
from shared.db import Database, Row
from shared.events import PendingEvent, append_events

#: Letters and digits that cannot be mistaken for each other when read aloud or typed (no 0/O, 1/I/L).
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8
CODE_TTL_MS = 3_600_000
MAX_PENDING = 3

Decision = Literal["approved", "new_code", "pending", "full"]


class PairingError(LookupError):
    """An approve or revoke that matched nothing (the message says why)."""


@dataclass(frozen=True)
class PairingCheck:
    """What to do with a sender: ``approved`` (go on), ``new_code`` (tell them ``code``, once),
    ``pending`` (already told; stay silent) or ``full`` (too many codes pending; stay silent)."""

    decision: Decision
    code: str = ""


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
        return self.status == "pending" and now - self.created_at > ttl_ms


def new_code() -> str:
    """A random pairing code such as ``K7QM2XPA``."""
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def check_sender(
    db: Database,
    channel: str,
    sender_id: str,
    sender: str = "",
    *,
    ttl_ms: int = CODE_TTL_MS,
    max_pending: int = MAX_PENDING,
    now: int | None = None,
) -> PairingCheck:
    """Decide about one inbound sender, issuing a code when they have none that is still valid.

    One write transaction, so two adapter processes racing on the same sender issue one code.
    """
    now = now_ms() if now is None else now
    probe = db.read_scalar(
        "SELECT status FROM pairings WHERE channel = :c AND sender_id = :s", {"c": channel, "s": sender_id}
    )
    if probe == "approved":
        return PairingCheck("approved")
    with db.transaction() as tx:
        row = tx.one(
            "SELECT * FROM pairings WHERE channel = :c AND sender_id = :s", {"c": channel, "s": sender_id}
        )
        if row is not None:
            current = Pairing.from_row(row)
            if current.status == "approved":
                return PairingCheck("approved")
            if current.status == "pending" and not current.expired(now, ttl_ms):
                return PairingCheck("pending")
        waiting = tx.scalar(
            "SELECT COUNT(*) FROM pairings WHERE channel = :c AND status = 'pending' AND created_at >= :since",
            {"c": channel, "since": now - ttl_ms},
        )
        if int(waiting or 0) >= max_pending:
            return PairingCheck("full")
        code = new_code()
        tx.execute(
            "INSERT INTO pairings (channel, sender_id, sender, code, status, created_at, approved_at) "
            "VALUES (:c, :s, :n, :code, 'pending', :now, NULL) ON CONFLICT (channel, sender_id) DO UPDATE SET "
            "sender = excluded.sender, code = excluded.code, status = 'pending', created_at = excluded.created_at, "
            "approved_at = NULL",
            {"c": channel, "s": sender_id, "n": sender, "code": code, "now": now},
        )
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
    return PairingCheck("new_code", code)


def approve(db: Database, code: str, *, ttl_ms: int = CODE_TTL_MS, now: int | None = None) -> Pairing:
    """Approve the pending pairing with ``code`` (case-insensitive). Raises PairingError when no valid
    pending code matches (unknown, already used or expired)."""
    now = now_ms() if now is None else now
    wanted = code.strip().upper()
    with db.transaction() as tx:
        row = tx.one(
            "SELECT * FROM pairings WHERE code = :code AND status = 'pending' ORDER BY created_at DESC",
            {"code": wanted},
        )
        if row is None:
            raise PairingError(f"no pending pairing has code {wanted!r}")
        found = Pairing.from_row(row)
        if found.expired(now, ttl_ms):
            raise PairingError(
                f"pairing code {wanted} expired; the sender gets a new one on their next message"
            )
        tx.execute(
            "UPDATE pairings SET status = 'approved', approved_at = :now WHERE channel = :c AND sender_id = :s",
            {"now": now, "c": found.channel, "s": found.sender_id},
        )
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
        row = tx.one(
            "SELECT * FROM pairings WHERE channel = :c AND sender_id = :s", {"c": channel, "s": sender_id}
        )
        if row is None or row["status"] == "revoked":
            raise PairingError(f"sender {sender_id!r} is not paired with channel {channel!r}")
        tx.execute(
            "UPDATE pairings SET status = 'revoked' WHERE channel = :c AND sender_id = :s",
            {"c": channel, "s": sender_id},
        )
        append_events(
            tx,
            [PendingEvent("pairing_revoked", {"channel": channel, "sender_id": sender_id}, topic="channels")],
            now,
        )
    return Pairing.from_row(dict(row, status="revoked"))


def list_pairings(db: Database, channel: str | None = None) -> list[Pairing]:
    """Every pairing (of one channel, or all), newest first."""
    if channel is None:
        rows = db.read("SELECT * FROM pairings ORDER BY created_at DESC, id DESC")
    else:
        rows = db.read(
            "SELECT * FROM pairings WHERE channel = :c ORDER BY created_at DESC, id DESC", {"c": channel}
        )
    return [Pairing.from_row(r) for r in rows]


def is_approved(db: Database, channel: str, sender_id: str) -> bool:
    """Whether the sender is paired with the channel now."""
    status = db.read_scalar(
        "SELECT status FROM pairings WHERE channel = :c AND sender_id = :s", {"c": channel, "s": sender_id}
    )
    return bool(status == "approved")
