"""Per-chat preferences kept in the ``kv`` table, so they survive restarts and reach every process.

- The busy policy of one chat (scope ``busy_policy``, key :attr:`ChatAddress.row_key`): what happens to
  messages that arrive while that chat's run goes on. Set by the channels' ``/queue MODE`` command, read by
  the processor (:func:`workers.busy.resolve_policy`), which falls back to ``[channels.<channel>]
  busy_policy`` and then ``[processor] busy_policy``. Both sides name the chat by the same rule, so a policy
  set from a chat is the one its runs follow.
"""

from __future__ import annotations

from shared.chat.address import ChatAddress
from shared.settings.busy_policy import BusyPolicy, parse_busy_policy
from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope


def get_busy_policy(db: Database, chat: ChatAddress) -> BusyPolicy | None:
    """The chat's own busy policy, or ``None`` when it follows the channel's or the processor's default.

    A policy an earlier release stored under the chat's conversation alone is still found
    (:attr:`ChatAddress.earlier_chat`) until the chat sets one again."""
    value = kv.get(db, Scope.BUSY_POLICY, chat.row_key)
    if value is None and chat.earlier_row_key is not None:
        value = kv.get(db, Scope.BUSY_POLICY, chat.earlier_row_key)
    if value is None:
        return None
    try:
        return parse_busy_policy(value)
    except ValueError:
        return None  # a value written by a newer release: behave as if unset


def set_busy_policy(db: Database, chat: ChatAddress, policy: str | None) -> BusyPolicy | None:
    """Set the chat's busy policy (``None`` or ``"default"``: back to the defaults). Returns what is stored.

    Raises ``ValueError`` for an unknown policy name (nothing changed). A row stored under the earlier key
    is removed with the change, so the chat's new choice is the one read back.
    """
    keys = [chat.row_key]
    if chat.earlier_row_key is not None:
        keys.append(chat.earlier_row_key)
    if policy is None or policy.strip().lower() == "default":
        with db.transaction() as tx:
            for key in keys:
                kv.delete(tx, Scope.BUSY_POLICY, key)
        return None
    name = parse_busy_policy(policy)
    with db.transaction() as tx:
        for key in keys[1:]:
            kv.delete(tx, Scope.BUSY_POLICY, key)
        kv.put(tx, Scope.BUSY_POLICY, chat.row_key, name)
    return name
