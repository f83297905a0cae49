"""Values a channel plugin keeps for itself, such as Telegram's next update offset, in the ``kv`` table
(scope ``platform_state:<channel>``, or the scope the plugin names for itself; key and value the plugin's).

The channel runner's intake reads and writes them for the plugin (:meth:`adapters.intake.Intake.saved`,
``saving``, ``save``); a value written with a message commits in the same transaction
(:func:`keep_value_in`), so a platform update is never confirmed without what it caused. A plugin that
names a scope of its own (``Platform.state_scope``) keeps its values there: Telegram's is ``telegram``,
where earlier releases kept its offset, so an existing database reads the same.
"""

from __future__ import annotations

from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope, scoped


def _scope(channel: str, own_scope: str) -> str:
    return own_scope or scoped(Scope.PLATFORM_STATE, channel)


def kept_value(db: Database, channel: str, key: str, *, own_scope: str = "") -> str | None:
    """The value ``channel``'s plugin keeps under ``key`` (in ``own_scope`` when it names one), or None."""
    return kv.get(db, _scope(channel, own_scope), key)


def keep_value_in(tx: Tx, channel: str, key: str, value: str, *, own_scope: str = "") -> None:
    """Keep ``value`` under ``key`` for ``channel``'s plugin (in ``own_scope`` when it names one), replacing
    the earlier one, in the caller's transaction."""
    kv.put(tx, _scope(channel, own_scope), key, value)
