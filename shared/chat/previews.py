"""Live previews of replies being written: the partial text of a run, and the preview message a channel shows.

A preview is not a reply. The processor keeps the text a run has streamed so far in ``kv`` (scope
``preview:<channel>``, key ``chat|edit_key``, the chat as :attr:`ChatAddress.chat` names it; :func:`put_partial`), at a bounded rate, and removes
it in the same transaction as the run's final reply (:func:`clear_partial_in`) or when the run ends
otherwise. A channel adapter reads the partial texts of its chats (:func:`partials`) and shows each as one
message edited in place; it keeps which platform message that is in ``kv`` (scope
``preview_sent:<channel>``, same key; :func:`shown`, :func:`put_shown`), so the final reply edits that
message into the answer, even after an adapter restart. The edit key is the one the run's "still working"
notes and its final reply carry (``metadata.edit_key``).

A run that dies leaves its text behind; a later run of the same messages takes its preview message over
and finishes it (the adapter; the dead run's record is marked done with ``taken_by``), and any other reply
about them closes it. When neither ever comes (the messages were dead-lettered with no notice to the chat, or
completed by an operator), the scheduler's previews job (:func:`prune_partials`) removes the text of every
run whose messages are no longer processing, and that of any run not written for
:data:`PARTIAL_MAX_AGE_MS`, and leaves a mark for each (scope ``preview_left:<channel>``; :func:`left`) in
the same transaction, by which the adapter edits the run's preview, if the chat shows one, to say the answer
was interrupted, and forgets the mark (:func:`forget_left_in`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.chat.address import ChatAddress
from shared.chat.lookups import processing_among
from shared.clock import now_ms
from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope, scoped

#: Preview-message records older than this are forgotten (an adapter that stopped half-way leaves some).
SHOWN_TTL_MS = 7 * 24 * 3600 * 1000
#: A preview holds at most this many characters of the text being written: the platforms show its first
#: 2,000-4,096 anyway, and the final reply carries the rest. A longer text is cut, with " …" after it.
PREVIEW_MAX_CHARS = 8000
#: A run's text not written for this long is removed whatever its messages' state: a run streams its text
#: as it grows, and a day without a word is far past any run's ``timeout_seconds`` (30 minutes by default).
PARTIAL_MAX_AGE_MS = 24 * 3600 * 1000


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
    """Record the text streamed so far (replacing the earlier one), at most :data:`PREVIEW_MAX_CHARS` of it."""
    text = bounded_preview(text)
    value = json.dumps({"text": text, "message_ids": message_ids}, separators=(",", ":"))
    kv.put(tx, scoped(Scope.PREVIEW, chat.channel), preview_key(chat.chat, edit_key), value)


def bounded_preview(text: str) -> str:
    """``text``, or its first :data:`PREVIEW_MAX_CHARS` characters and " …" when it is longer."""
    return text if len(text) <= PREVIEW_MAX_CHARS else text[:PREVIEW_MAX_CHARS] + " …"


def clear_partial_in(tx: Tx, chat: ChatAddress, edit_key: str) -> None:
    """Forget a run's partial text (with its final reply, or when it ended without one)."""
    kv.delete(tx, scoped(Scope.PREVIEW, chat.channel), preview_key(chat.chat, edit_key))


def clear_partial(db: Database, chat: ChatAddress, edit_key: str) -> None:
    """:func:`clear_partial_in` in a transaction of its own."""
    db.run_transaction(lambda tx: clear_partial_in(tx, chat, edit_key))


def partials(db: Database, channel: str, *, prefix: str | None = None) -> list[Partial]:
    """The partial texts of every run streaming into a chat of ``channel`` (keys starting with ``prefix``
    when given), oldest first."""
    entries = kv.entries(db, scoped(Scope.PREVIEW, channel), prefix=prefix, by_time=True)
    return [p for p in map(_partial, entries) if p is not None]


def _partial(entry: kv.Entry) -> Partial | None:
    conversation, _, edit_key = entry.key.rpartition("|")
    try:
        value = json.loads(entry.value)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    ids = value.get("message_ids")
    return Partial(
        conversation,
        edit_key,
        str(value.get("text") or ""),
        tuple(str(i) for i in ids) if isinstance(ids, list) else (),
        entry.updated_at,
    )


def partial(db: Database, chat: ChatAddress, edit_key: str) -> Partial | None:
    """The partial text of one run in one chat, or None once it is gone (the final reply removed it)."""
    key = preview_key(chat.chat, edit_key)
    found = [p for p in partials(db, chat.channel, prefix=key) if p.edit_key == edit_key]
    return found[0] if found else None


def shown(src: Database | Tx, chat: ChatAddress, edit_key: str) -> dict[str, Any] | None:
    """The preview message a channel shows for a run: ``{"id", "text", "message_ids", "done"}``, or None."""
    return kv.get_record(src, scoped(Scope.PREVIEW_SENT, chat.channel), preview_key(chat.chat, edit_key))


def shown_in_chat(db: Database, chat: ChatAddress) -> dict[str, dict[str, Any]]:
    """Every preview-message record of one chat, by edit key, oldest written first."""
    return {edit_key: record for edit_key, record, _ in shown_entries(db, chat)}


def shown_entries(db: Database, chat: ChatAddress) -> list[tuple[str, dict[str, Any], int]]:
    """Every preview-message record of one chat as ``(edit key, record, when it was last written)``, oldest
    written first."""
    found: list[tuple[str, dict[str, Any], int]] = []
    prefix = f"{chat.chat}|"
    for entry in kv.entries(db, scoped(Scope.PREVIEW_SENT, chat.channel), prefix=prefix, by_time=True):
        try:
            record = json.loads(entry.value)
        except ValueError:
            continue
        if isinstance(record, dict):
            found.append((entry.key[len(prefix) :], record, entry.updated_at))
    return found


def put_shown(chat: ChatAddress, edit_key: str, record: dict[str, Any]) -> Callable[[Tx], None]:
    """The write of a preview-message record, for a transaction of the caller's (old records are forgotten
    in the same write)."""
    value = json.dumps(record, separators=(",", ":"))

    def write(tx: Tx) -> None:
        scope, now = scoped(Scope.PREVIEW_SENT, chat.channel), now_ms()
        kv.put(tx, scope, preview_key(chat.chat, edit_key), value, now)
        kv.delete_older(tx, scope, now - SHOWN_TTL_MS)

    return write


# -- texts no run will finish -------------------------------------------------------------------------------
def prune_partials(db: Database, *, now: int | None = None, max_age_ms: int = PARTIAL_MAX_AGE_MS) -> int:
    """Remove the text of every run whose messages are none of them processing (the run is gone: completed
    or dead-lettered without its final, or taken back to pending) and of every run not written for
    ``max_age_ms``; mark each for the chat's adapter to close its preview, if it shows one (:func:`left`). One
    transaction; a text a live writer rewrites meanwhile stays. Returns how many texts were removed."""
    now = now_ms() if now is None else now

    def prune(tx: Tx) -> int:
        rows = [(scope, entry, _partial(entry)) for scope, entry in kv.family_entries(tx, Scope.PREVIEW)]
        running = processing_among(tx, {m for _, _, p in rows if p is not None for m in p.message_ids})
        removed = 0
        for scope, entry, found in rows:
            alive = found is not None and bool(running.intersection(found.message_ids))
            if alive and entry.updated_at >= now - max_age_ms:
                continue
            if not kv.delete_unchanged(tx, scope, entry.key, entry.updated_at):
                continue  # rewritten since it was read: a run writes it
            removed += 1
            # Marked whether or not the chat shows the run's preview yet: an adapter may be sending it right
            # now, and it records what it sent only afterwards (under the chat's lock, which the closing of
            # the mark takes too).
            kv.put(tx, scoped(Scope.PREVIEW_LEFT, scope[len(Scope.PREVIEW.value) :]), entry.key, "{}", now)
        if removed:
            tx.signal("previews")
        kv.delete_older(tx, Scope.PREVIEW_LEFT.value, now - SHOWN_TTL_MS, family=True)
        return removed

    with db.transaction() as tx:
        return prune(tx)


def left(db: Database, channel: str) -> list[tuple[str, str]]:
    """The previews of ``channel`` whose run's text :func:`prune_partials` removed, as ``(conversation,
    edit_key)``: the adapter closes each and forgets its mark (:func:`forget_left_in`)."""
    return [
        (conversation, edit_key)
        for conversation, _, edit_key in (
            e.key.rpartition("|") for e in kv.entries(db, scoped(Scope.PREVIEW_LEFT, channel))
        )
    ]


def forget_left_in(tx: Tx, chat: ChatAddress, edit_key: str) -> None:
    """Forget the mark of a preview :func:`prune_partials` left (the adapter closed the preview)."""
    kv.delete(tx, scoped(Scope.PREVIEW_LEFT, chat.channel), preview_key(chat.chat, edit_key))
