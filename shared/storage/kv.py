"""The small key-value store: the one owner of every statement on the ``kv`` table.

Everything agentpost keeps that is not a queue row — a chat's busy policy, delivery attempts, pairing-held
messages, channel cursors and health, the event log's prune mark — lives in ``kv`` under a *scope*. Every
scope is named once, in :class:`Scope` below, so a reader sees in one place what the table holds and who
cleans each scope up.

Reads take a :class:`~shared.storage.db.Database` (an autocommit snapshot) or an open :class:`~shared.storage.db.Tx` (inside a
transaction); writes take a ``Tx``, so a caller can group them with its other work.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.clock import now_ms
from shared.storage.db import Database, Row, Tx
from shared.storage.statuses import PairingStatus


class Scope(StrEnum):
    """Every scope of the ``kv`` table. A scope ending in ``:`` is a family, completed by a channel or chat
    (see :func:`scoped`); the comment says what a key is and what removes the row. The values are what
    earlier releases wrote: changing one orphans the rows of existing databases."""

    #: key agent → JSON of the run in progress (conversation_status); deleted when the run ends.
    AGENT_RUN = "agent_run"
    #: key ``agent|channel:chat`` → JSON list of the tool uses a person allowed "for this chat"
    #: (queue.approvals); deleted by the chat's ``/reset``.
    APPROVAL_RULES = "approval_rules"
    #: key ``last`` / ``last_ok`` → JSON of the latest backup taken and the latest that succeeded
    #: (storage.backup_record); overwritten by the next backup.
    BACKUP = "backup"
    #: key ``channel:conversation`` → busy policy name (chat_prefs); deleted by ``/busy default``.
    BUSY_POLICY = "busy_policy"
    #: key root message id → runs spent by one user message's chain (chain_budget); pruned by age.
    CHAIN_RUNS = "chain_runs"
    #: key channel → JSON health of a channel adapter (channel_health); overwritten in place (few rows).
    CHANNEL_HEALTH = "channel_health"
    #: key ``channel:conversation:…`` → the agent a chat last spoke with (chat_agents); pruned by age.
    CHAT_AGENTS = "chat_agents"
    #: key response id → failed delivery attempts (queue_delivery); deleted when the reply is settled.
    DELIVERY_ATTEMPTS = "delivery_attempts"
    #: key message id → automatic dead-letter retries done (queue_admin); nothing removes these yet.
    DLQ_AUTO_RETRIES = "dlq.auto_retries"
    #: key archive entry → JSON of its restore (queue.dlq_restores): a restore is never done twice.
    DLQ_RESTORED = "dlq.restored"
    #: key ``*`` → newest pruned event cursor (events); one row.
    EVENTS_PRUNED = "events.pruned"
    #: key agent → JSON of the agent's workspace (id, host it was made on, path; queue.workspaces);
    #: overwritten when the workspace is made again, kept when the agent is removed (its folder is kept).
    WORKSPACE = "workspace"
    #: key agent → until when the agent runs on its fallback model after a rate limit (queue.model_fallback);
    #: overwritten by the agent's next limit.
    MODEL_FALLBACK = "model_fallback"
    #: key worker id → JSON of a running processor (queue.presence); refreshed every minute, deleted when it
    #: stops, a killed one's row forgotten a day later by the next processor to start.
    PROCESSORS = "processors"
    #: key worker id → JSON of a running scheduler process (queue.presence): like ``processors``, for the
    #: process whose jobs (recovery, retention, backups, heartbeats, schedules) stop when it is gone.
    SCHEDULERS = "schedulers"
    #: key Telegram's offset key → the next update offset (adapters.telegram, through the runner's
    #: :meth:`adapters.intake.Intake.saved` and chat.kept_values); overwritten in place.
    TELEGRAM = "telegram"
    #: family by channel: key → a value a channel plugin keeps for itself (chat.kept_values, through
    #: adapters.intake's ``saved``), for plugins that name no scope of their own (Telegram keeps ``telegram``).
    PLATFORM_STATE = "platform_state:"
    #: family by channel: key conversation → the chat's sticky default agent (chat.sticky_agents).
    CHAT_AGENT = "chat_agent:"
    #: family by channel: key conversation → platform cursor (channel_cursors); overwritten in place.
    CURSOR = "cursor:"
    #: family by channel: key sender id → JSON list of messages held until pairing (held_messages).
    HELD = "held:"
    #: family by channel: key job id → JSON of a media download to do (inbound_jobs); deleted when done.
    INBOUND_JOBS = "inbound_jobs:"
    #: family by channel: key conversation → JSON of the last voice note heard there (chat.voice_heard);
    #: overwritten by the chat's next one, pruned after 7 days.
    VOICE_HEARD = "voice_heard:"
    #: family by channel: key sender id → when the last pairing reminder went out (held_messages).
    PAIRING_REMINDED = "pairing_reminded:"
    #: family by adapter (``progress.<channel>``, not ``:``-joined): key → a progress note's edit record.
    PROGRESS = "progress."
    #: family by channel: key ``conversation|edit_key`` → JSON of the text a run has streamed so far
    #: (chat.previews); written by the processor at a bounded rate, deleted with the run's final reply or
    #: when the run ends otherwise; the scheduler's previews job deletes those whose messages are no longer
    #: processing (a crashed run never re-run) and those not written for a day.
    PREVIEW = "preview:"
    #: family by channel: key ``conversation|edit_key`` → JSON of the preview message an adapter shows for a
    #: run (chat.previews); marked done by the final reply, pruned after 7 days.
    PREVIEW_SENT = "preview_sent:"
    #: family by channel: key ``conversation|edit_key`` → a run whose text the scheduler's previews job
    #: deleted (chat.previews); deleted by the adapter once it closed the run's preview (edited it to say the
    #: answer was interrupted), pruned after 7 days (a channel whose adapter shows no previews).
    PREVIEW_LEFT = "preview_left:"
    #: family by channel: key platform message id → seen (platform_dedupe); pruned after 8 days.
    SEEN = "seen:"
    #: family by channel: what :attr:`SEEN` was called before; still read, pruned like it (platform_dedupe).
    HANDLED_LEGACY = "handled:"
    #: family by channel: key platform message id → response id it delivered (queue_delivery).
    SENT = "sent:"
    #: family by chat (``channel:conversation``): key → an undelivered-reply notice (queue_delivery).
    UNDELIVERED = "undelivered:"


def scoped(family: Scope, name: str) -> str:
    """The scope of one member of a family: ``scoped(Scope.HELD, "telegram")`` → ``"held:telegram"``."""
    if not family.value.endswith((":", ".")):
        raise ValueError(f"{family.name} is a single scope, not a family")
    return family.value + name


@dataclass(frozen=True)
class Entry:
    """One row of a scope."""

    key: str
    value: str
    updated_at: int


_GET = "SELECT value FROM kv WHERE scope = :s AND key = :k"
_GET_ENTRY = "SELECT key, value, updated_at FROM kv WHERE scope = :s AND key = :k"
_PUT = (
    "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) "
    "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at"
)
_ADD = "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) ON CONFLICT (scope, key) DO NOTHING"
_DELETE = "DELETE FROM kv WHERE scope = :s AND key = :k"
#: Keys per statement in :func:`get_many` / :func:`delete_keys`: well under SQLite's bound-variable limit.
_CHUNK = 500


def _rows(src: Database | Tx, sql: str, params: dict[str, Any]) -> list[Row]:
    return src.rows(sql, params) if isinstance(src, Tx) else src.read(sql, params)


def get(src: Database | Tx, scope: str, key: str) -> str | None:
    """The value under ``(scope, key)``, or ``None``."""
    found = _rows(src, _GET, {"s": scope, "k": key})
    return None if not found else str(found[0]["value"])


def get_locked(tx: Tx, scope: str, key: str, initial: str, now: int | None = None) -> str:
    """The value under ``(scope, key)``, made ``initial`` when there is none, with the row locked until
    ``tx`` ends: for a read-modify-write that two transactions may do at once. On PostgreSQL a plain read
    lets both read the same value and the later write lose the earlier one; here the second waits for the
    first to commit and reads what it wrote (SQLite's write transactions take turns anyway)."""
    add(tx, scope, key, initial, now)
    found = tx.rows(f"{_GET}{tx.dialect.lock_rows}", {"s": scope, "k": key})
    return str(found[0]["value"])


def get_record(src: Database | Tx, scope: str, key: str) -> dict[str, Any] | None:
    """The JSON object stored under ``(scope, key)``; ``None`` when there is none or it is not an object
    (a record written by a release that stored something else reads as missing)."""
    value = get(src, scope, key)
    if value is None:
        return None
    try:
        record = json.loads(value)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def get_many(src: Database | Tx, scope: str, keys: Sequence[str]) -> dict[str, str]:
    """The values under ``keys`` of one scope that exist, by key (one read per :data:`_CHUNK` keys)."""
    found: dict[str, str] = {}
    unique = list(dict.fromkeys(keys))
    for start in range(0, len(unique), _CHUNK):
        params, marks = _key_list(unique[start : start + _CHUNK], {"s": scope})
        for r in _rows(src, f"SELECT key, value FROM kv WHERE scope = :s AND key IN ({marks})", params):
            found[str(r["key"])] = str(r["value"])
    return found


def get_entry(src: Database | Tx, scope: str, key: str) -> Entry | None:
    """The row under ``(scope, key)`` with its time, or ``None``."""
    found = _rows(src, _GET_ENTRY, {"s": scope, "k": key})
    return None if not found else _entry(found[0])


def entries(
    src: Database | Tx,
    scope: str,
    *,
    prefix: str | None = None,
    since: int | None = None,
    by_time: bool = False,
) -> list[Entry]:
    """The rows of a scope, by key (or by time with ``by_time``); only keys starting with ``prefix`` and only
    rows written at or after ``since`` (epoch ms) when given."""
    sql = "SELECT key, value, updated_at FROM kv WHERE scope = :s"
    params: dict[str, Any] = {"s": scope}
    sql += _prefix_condition(prefix, params)
    if since is not None:
        sql += " AND updated_at >= :since"
        params["since"] = since
    sql += " ORDER BY updated_at, key" if by_time else " ORDER BY key"
    return [_entry(r) for r in _rows(src, sql, params)]


def family_entries(src: Database | Tx, family: str) -> list[tuple[str, Entry]]:
    """The rows of every member scope of ``family`` (a :class:`Scope` ending in ``:`` or ``.``), each with its
    scope, by scope and key."""
    sql = "SELECT scope, key, value, updated_at FROM kv WHERE scope >= :slo AND scope < :shi ORDER BY scope, key"
    rows = _rows(src, sql, {"slo": family, "shi": _after_prefix(family)})
    # The range is exact under the C collation; a database created with another one may order punctuation
    # differently, so the prefix is checked again here.
    return [(str(r["scope"]), _entry(r)) for r in rows if str(r["scope"]).startswith(family)]


def any_in(src: Database | Tx, scope: str) -> bool:
    """True when the scope holds at least one row."""
    return bool(_rows(src, "SELECT 1 AS x FROM kv WHERE scope = :s LIMIT 1", {"s": scope}))


def approved_sender_entries(src: Database | Tx, scope: str, channel: str) -> list[Entry]:
    """The rows of ``scope`` whose key is a sender id with an approved pairing on ``channel``, by key.

    One join in one snapshot (held messages of senders approved since they wrote), so a pairing approved
    between two separate reads cannot be seen half-way."""
    sql = (
        "SELECT kv.key AS key, kv.value AS value, kv.updated_at AS updated_at FROM kv JOIN pairings p "
        f"ON p.channel = :c AND p.sender_id = kv.key AND p.status = '{PairingStatus.APPROVED}' "
        "WHERE kv.scope = :s ORDER BY kv.key"
    )
    return [_entry(r) for r in _rows(src, sql, {"s": scope, "c": channel})]


def put(tx: Tx, scope: str, key: str, value: str, now: int | None = None) -> None:
    """Write ``value`` under ``(scope, key)``, replacing what was there."""
    tx.execute(_PUT, {"s": scope, "k": key, "v": value, "now": now_ms() if now is None else now})


def put_max(
    tx: Tx, scope: str, key: str, value: str, now: int | None = None, *, numeric: bool = False
) -> bool:
    """Write ``value`` under ``(scope, key)`` unless the stored value is already as large (compared as text,
    or as integers with ``numeric``), so a record only moves forward whatever order writers commit in.
    True when written."""
    bigger = (
        "CAST(kv.value AS BIGINT) < CAST(excluded.value AS BIGINT)"
        if numeric
        else "kv.value < excluded.value"
    )
    cur = tx.execute(
        f"{_PUT} WHERE {bigger}", {"s": scope, "k": key, "v": value, "now": now_ms() if now is None else now}
    )
    return bool(cur.rowcount)


def replace(tx: Tx, scope: str, key: str, value: str) -> bool:
    """Change the value of an existing row, keeping its time (so its place in a ``by_time`` listing and its
    age for :func:`delete_older`); no row is made when there is none. True when a row changed."""
    cur = tx.execute(
        "UPDATE kv SET value = :v WHERE scope = :s AND key = :k", {"s": scope, "k": key, "v": value}
    )
    return bool(cur.rowcount)


def add(tx: Tx, scope: str, key: str, value: str, now: int | None = None) -> bool:
    """Write ``value`` under ``(scope, key)`` unless a row is there already. True when written."""
    cur = tx.execute(_ADD, {"s": scope, "k": key, "v": value, "now": now_ms() if now is None else now})
    return bool(cur.rowcount)


def delete(tx: Tx, scope: str, key: str) -> int:
    """Remove one row; returns how many were removed (0 or 1)."""
    return int(tx.execute(_DELETE, {"s": scope, "k": key}).rowcount)


def delete_unchanged(tx: Tx, scope: str, key: str, updated_at: int) -> bool:
    """Remove one row only if it was last written at ``updated_at`` (as read earlier): a row rewritten since
    is another writer's newer value and stays. True when removed."""
    cur = tx.execute(f"{_DELETE} AND updated_at = :at", {"s": scope, "k": key, "at": updated_at})
    return bool(cur.rowcount)


def delete_keys(tx: Tx, scope: str, keys: Sequence[str]) -> int:
    """Remove the rows under ``keys`` of one scope; returns how many were removed."""
    removed = 0
    unique = list(dict.fromkeys(keys))
    for start in range(0, len(unique), _CHUNK):
        params, marks = _key_list(unique[start : start + _CHUNK], {"s": scope})
        removed += int(tx.execute(f"DELETE FROM kv WHERE scope = :s AND key IN ({marks})", params).rowcount)
    return removed


def delete_scope(tx: Tx, scope: str, *, prefix: str | None = None) -> int:
    """Remove every row of a scope (only keys starting with ``prefix`` when given)."""
    params: dict[str, Any] = {"s": scope}
    sql = "DELETE FROM kv WHERE scope = :s" + _prefix_condition(prefix, params)
    return int(tx.execute(sql, params).rowcount)


def delete_older(tx: Tx, scope: str, before: int, *, family: bool = False, prefix: str | None = None) -> int:
    """Remove the rows of ``scope`` last written before ``before`` (epoch ms), only those whose key starts
    with ``prefix`` when given. With ``family``, ``scope`` is a family prefix (a :class:`Scope` ending in
    ``:`` or ``.``, or such a prefix completed in part, e.g. ``undelivered:telegram:``) and every member
    scope is pruned."""
    if family:
        params: dict[str, Any] = {"slo": scope, "shi": _after_prefix(scope), "cut": before}
        sql = "DELETE FROM kv WHERE scope >= :slo AND scope < :shi AND updated_at < :cut"
    else:
        params = {"s": scope, "cut": before}
        sql = "DELETE FROM kv WHERE scope = :s AND updated_at < :cut"
    sql += _prefix_condition(prefix, params)
    return int(tx.execute(sql, params).rowcount)


def _prefix_condition(prefix: str | None, params: dict[str, Any]) -> str:
    # A key range instead of LIKE: it uses the (scope, key) primary key and needs no escaping of '%' or '_'.
    if not prefix:
        return ""
    params["lo"], params["hi"] = prefix, _after_prefix(prefix)
    return " AND key >= :lo AND key < :hi"


def _key_list(keys: Sequence[str], params: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """``params`` with one bind per key, and the ``:k0, :k1, …`` list naming them."""
    names = [f"k{i}" for i in range(len(keys))]
    params.update(zip(names, keys, strict=True))
    return params, ", ".join(":" + n for n in names)


def _after_prefix(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix``."""
    return prefix + "\U0010ffff"


def _entry(row: Row) -> Entry:
    return Entry(str(row["key"]), str(row["value"]), int(row["updated_at"]))
