"""The states of the three status columns, declared once: a row of ``messages``, of ``responses`` and of
``pairings`` each moves through its own small state machine, and every line of code and SQL that names a
state takes it from here (tests/unit/test_statuses.py fails on a bare status string elsewhere).

The members are ``str`` values (:class:`~enum.StrEnum`): they compare equal to what the database returns,
drivers store them as their text, and an f-string puts the text itself into SQL, so a statement (and the
partial indexes whose ``WHERE`` names a state, which the planner matches only against the same literal)
reads exactly as before.
"""

from __future__ import annotations

from enum import StrEnum


class MessageStatus(StrEnum):
    """A queued message: ``pending`` (waiting, or waiting for its retry) → ``processing`` (claimed by a
    worker) → ``completed``; ``dead`` once it failed for good (a retry by hand makes it ``pending`` again)."""

    PENDING = "pending"
    PROCESSING = "processing"
    COMPLETED = "completed"
    DEAD = "dead"


class ResponseStatus(StrEnum):
    """A reply waiting for its channel: ``pending`` → ``delivering`` (claimed by the channel's sender) →
    ``acked`` once the platform took it, or ``failed`` when it refused it for good."""

    PENDING = "pending"
    DELIVERING = "delivering"
    ACKED = "acked"
    FAILED = "failed"


class PairingStatus(StrEnum):
    """A sender's pairing request: ``pending`` (a code was handed out) → ``approved`` by the operator."""

    PENDING = "pending"
    APPROVED = "approved"


class ApprovalStatus(StrEnum):
    """A question to a person before a tool runs (:mod:`shared.chat.approvals`): ``pending`` until it is
    answered (``allowed`` / ``denied``), its time runs out (``timed_out``), the run asking it ends first
    (``cancelled``: a ``/stop``, a finished run) or the run is started again after a crash (``expired``)."""

    PENDING = "pending"
    ALLOWED = "allowed"
    DENIED = "denied"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
