"""Per-chat preferences kept in the ``kv`` table, so they survive restarts and reach every process.

- The busy policy of one chat (scope ``busy_policy``, key ``<channel>:<conversation>``): what happens to
  messages that arrive while that chat's run goes on. Set by the channels' ``/queue MODE`` command, read by
  the processor (:func:`workers.busy.resolve_policy`), which falls back to ``[channels.<channel>]
  busy_policy`` and then ``[processor] busy_policy``.
"""

from __future__ import annotations

from typing import Literal, cast, get_args

from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope

BusyPolicy = Literal["collect", "followup", "interrupt"]
#: The policies, in the order the help text lists them.
BUSY_POLICIES: tuple[str, ...] = get_args(BusyPolicy)


def chat_key(channel: str, conversation: str) -> str:
    """The key of one chat: ``<channel>:<conversation>`` (the same form ``/stop`` requests use)."""
    return f"{channel}:{conversation}"


def parse_busy_policy(value: str) -> BusyPolicy:
    """Validate a policy name (case-insensitive); raises ``ValueError`` naming the valid ones."""
    name = value.strip().lower()
    if name not in BUSY_POLICIES:
        raise ValueError(f"unknown busy policy {value!r} (use one of: {', '.join(BUSY_POLICIES)})")
    return cast(BusyPolicy, name)


def get_busy_policy(db: Database, channel: str, conversation: str) -> BusyPolicy | None:
    """The chat's own busy policy, or ``None`` when it follows the channel's or the processor's default."""
    value = kv.get(db, Scope.BUSY_POLICY, chat_key(channel, conversation))
    if value is None:
        return None
    try:
        return parse_busy_policy(value)
    except ValueError:
        return None  # a value written by a newer release: behave as if unset


def set_busy_policy(db: Database, channel: str, conversation: str, policy: str | None) -> BusyPolicy | None:
    """Set the chat's busy policy (``None`` or ``"default"``: back to the defaults). Returns what is stored.

    Raises ``ValueError`` for an unknown policy name (nothing changed).
    """
    key = chat_key(channel, conversation)
    if policy is None or policy.strip().lower() == "default":
        with db.transaction() as tx:
            kv.delete(tx, Scope.BUSY_POLICY, key)
        return None
    name = parse_busy_policy(policy)
    with db.transaction() as tx:
        kv.put(tx, Scope.BUSY_POLICY, key, name)
    return name
