"""Pairing of chat senders with a channel: who needs a code, and when to issue one.

A sender the channel does not know gets a one-time 8-character code, once; their first messages are kept
(:mod:`shared.chat.held`), not queued. An operator runs ``agentpost pairing approve CODE`` (or approves on
the web API); the channel then tells the sender and answers the kept messages, and from then on the sender's
messages go through. A sender still waiting is reminded at most every ten minutes.
Codes expire after an hour (a later message gets a fresh code) and at most a few codes are pending per
channel at a time, so a flood of strangers cannot fill the table or the operator's list.

Rows (stored by :mod:`shared.chat.pairings`): one per ``(channel, sender_id)``; ``status`` is ``pending``,
``approved`` or ``revoked``.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

from shared.chat.pairings import (
    CODE_TTL_MS,
    Pairing,
    PairingError,
    approve,
    find,
    is_approved,
    issue_code,
    list_pairings,
    pending_since,
    revoke,
)
from shared.clock import now_ms
from shared.settings.channels import MAX_PENDING_PAIRINGS
from shared.storage.db import Database
from shared.storage.statuses import PairingStatus

#: Letters and digits that cannot be mistaken for each other when read aloud or typed (no 0/O, 1/I/L).
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8
MAX_PENDING = MAX_PENDING_PAIRINGS  # the default of [channels.*] pairing_max_pending

Decision = Literal["approved", "new_code", "pending", "full"]


@dataclass(frozen=True)
class PairingCheck:
    """What to do with a sender: ``approved`` (go on), ``new_code`` (tell them ``code``, once),
    ``pending`` (already told ``code``; remind them now and then) or ``full`` (too many codes pending)."""

    decision: Decision
    code: str = ""


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
    if is_approved(db, channel, sender_id):  # the common case, without taking the write lock
        return PairingCheck("approved")
    with db.transaction() as tx:
        current = find(tx, channel, sender_id)
        if current is not None:
            if current.status == PairingStatus.APPROVED:
                return PairingCheck("approved")
            if current.status == PairingStatus.PENDING and not current.expired(now, ttl_ms):
                return PairingCheck("pending", current.code)
        if pending_since(tx, channel, now - ttl_ms) >= max_pending:
            return PairingCheck("full")
        code = new_code()
        issue_code(tx, channel, sender_id, sender, code, now)
    return PairingCheck("new_code", code)


__all__ = [
    "CODE_TTL_MS",
    "Pairing",
    "PairingCheck",
    "PairingError",
    "approve",
    "check_sender",
    "is_approved",
    "list_pairings",
    "new_code",
    "revoke",
]
