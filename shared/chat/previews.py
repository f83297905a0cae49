"""Live previews of replies being written: the partial text of a run, and the preview message a channel shows.

A preview is not a reply. The processor keeps the text a run has streamed so far in ``kv`` (scope
``preview:<channel>``, key ``chat|edit_key``, the chat as :attr:`ChatAddress.chat` names it; :func:`put_partial`), at a bounded rate, and removes
it in the same transaction as the run's final reply (:func:`clear_partial_in`) or when the run ends
otherwise. A channel adapter reads the partial texts of its chats (:func:`partials`) and shows each as one
message edited in place; it keeps which platform message that is in ``kv`` (scope
``preview_sent:<channel>``, same key; :func:`shown`, :func:`put_shown`), so the final reply edits that
message into the answer, even after an adapter restart. The edit key is the one the run's "still working"
notes and its final reply carry (``metadata.edit_key``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope, scoped

#: Preview-message records older than this are forgotten (an adapter that stopped half-way leaves some).
SHOWN_TTL_MS = 7 * 24 * 3600 * 1000


def preview_key(conversation: str, edit_key: str) -> str:
    """The ``kv`` key of one run's preview in a chat."""
    return f"{conversation}|{edit_key}"


@dataclass(frozen=True)
class Partial:
    """The text a run has streamed so far for one chat (``message_ids``: the messages it answers)."""

    conversation: str
    edit_key: str
    text: str
    message_ids: tuple[str, ...]
    updated_at: int


def put_partial(tx: Tx, chat: ChatAddress, edit_key: str, text: str, message_ids: list[str]) -> None:
    """Record the text streamed so far (replacing the earlier one)."""
    value = json.dumps({"text": text, "message_ids": message_ids}, separators=(",", ":"))
    kv.put(tx, scoped(Scope.PREVIEW, chat.channel), preview_key(chat.chat, edit_key), value)


def clear_partial_in(tx: Tx, chat: ChatAddress, edit_key: str) -> None:
    """Forget a run's partial text (with its final reply, or when it ended without one)."""
    kv.delete(tx, scoped(Scope.PREVIEW, chat.channel), preview_key(chat.chat, edit_key))


def clear_partial(db: Database, chat: ChatAddress, edit_key: str) -> None:
    """:func:`clear_partial_in` in a transaction of its own."""
    db.run_transaction(lambda tx: clear_partial_in(tx, chat, edit_key))


def partials(db: Database, channel: str, *, prefix: str | None = None) -> list[Partial]:
    """The partial texts of every run streaming into a chat of ``channel`` (keys starting with ``prefix``
    when given), oldest first."""
    found: list[Partial] = []
    for entry in kv.entries(db, scoped(Scope.PREVIEW, channel), prefix=prefix, by_time=True):
        conversation, _, edit_key = entry.key.rpartition("|")
        try:
            value = json.loads(entry.value)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        ids = value.get("message_ids")
        found.append(
            Partial(
                conversation,
                edit_key,
                str(value.get("text") or ""),
                tuple(str(i) for i in ids) if isinstance(ids, list) else (),
                entry.updated_at,
            )
        )
    return found


def partial(db: Database, chat: ChatAddress, edit_key: str) -> Partial | None:
    """The partial text of one run in one chat, or None once it is gone (the final reply removed it)."""
    key = preview_key(chat.chat, edit_key)
    found = [p for p in partials(db, chat.channel, prefix=key) if p.edit_key == edit_key]
    return found[0] if found else None


def shown(src: Database | Tx, chat: ChatAddress, edit_key: str) -> dict[str, Any] | None:
    """The preview message a channel shows for a run: ``{"id", "text", "message_ids", "done"}``, or None."""
    return kv.get_record(src, scoped(Scope.PREVIEW_SENT, chat.channel), preview_key(chat.chat, edit_key))


def shown_in_chat(db: Database, chat: ChatAddress) -> dict[str, dict[str, Any]]:
    """Every preview-message record of one chat, by edit key."""
    records: dict[str, dict[str, Any]] = {}
    prefix = f"{chat.chat}|"
    for entry in kv.entries(db, scoped(Scope.PREVIEW_SENT, chat.channel), prefix=prefix):
        try:
            record = json.loads(entry.value)
        except ValueError:
            continue
        if isinstance(record, dict):
            records[entry.key[len(prefix) :]] = record
    return records


def put_shown(chat: ChatAddress, edit_key: str, record: dict[str, Any]) -> Callable[[Tx], None]:
    """The write of a preview-message record, for a transaction of the caller's (old records are forgotten
    in the same write)."""
    value = json.dumps(record, separators=(",", ":"))

    def write(tx: Tx) -> None:
        scope, now = scoped(Scope.PREVIEW_SENT, chat.channel), now_ms()
        kv.put(tx, scope, preview_key(chat.chat, edit_key), value, now)
        kv.delete_older(tx, scope, now - SHOWN_TTL_MS)

    return write
