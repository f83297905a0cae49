"""The small key-value store: the one owner of every statement on the ``kv`` table.

Everything agentpost keeps that is not a queue row — a chat's busy policy, delivery attempts, pairing-held
messages, channel cursors and health, the event log's prune mark — lives in ``kv`` under a *scope*. Every
scope is named once, in :class:`Scope` below, so a reader sees in one place what the table holds and who
cleans each scope up.

Reads take a :class:`~shared.db.Database` (an autocommit snapshot) or an open :class:`~shared.db.Tx` (inside a
transaction); writes take a ``Tx``, so a caller can group them with its other work.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from shared.clock import now_ms
from shared.db import Database, Row, Tx


class Scope(StrEnum):
    """Every scope of the ``kv`` table. A scope ending in ``:`` is a family, completed by a channel or chat
    (see :func:`scoped`); the comment says what a key is and what removes the row. The values are what
    earlier releases wrote: changing one orphans the rows of existing databases."""

    #: key agent → JSON of the run in progress (conversation_status); deleted when the run ends.
    AGENT_RUN = "agent_run"
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
    #: key message id → automatic dead-letter retries done (queue_admin).
    DLQ_AUTO_RETRIES = "dlq.auto_retries"
    #: key archive entry → restored marker (scheduler.dlq): a restore is never done twice.
    DLQ_RESTORED = "dlq.restored"
    #: key ``*`` → newest pruned event cursor (events); one row.
    EVENTS_PRUNED = "events.pruned"
    #: key agent → JSON of the fallback model in use after rate limits (workers.ratelimit).
    MODEL_FALLBACK = "model_fallback"
    #: family by channel: key conversation → the agent the chat talks to (adapters.chat_state).
    CHAT_AGENT = "chat_agent:"
    #: family by channel: key conversation → platform cursor (channel_cursors); overwritten in place.
    CURSOR = "cursor:"
    #: family by channel: key sender id → JSON list of messages held until pairing (held_messages).
    HELD = "held:"
    #: family by channel: key job id → JSON of a media download to do (inbound_jobs); deleted when done.
    INBOUND_JOBS = "inbound_jobs:"
    #: family by channel: key sender id → when the last pairing reminder went out (held_messages).
    PAIRING_REMINDED = "pairing_reminded:"
    #: family by adapter (``progress.<channel>``, not ``:``-joined): key → a progress note's edit record.
    PROGRESS = "progress."
    #: family by channel: key platform message id → seen (platform_dedupe); pruned after 8 days.
    SEEN = "seen:"
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


def _rows(src: Database | Tx, sql: str, params: dict[str, Any]) -> list[Row]:
    return src.rows(sql, params) if isinstance(src, Tx) else src.read(sql, params)


def get(src: Database | Tx, scope: str, key: str) -> str | None:
    """The value under ``(scope, key)``, or ``None``."""
    found = _rows(src, _GET, {"s": scope, "k": key})
    return None if not found else str(found[0]["value"])


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


def any_in(src: Database | Tx, scope: str) -> bool:
    """True when the scope holds at least one row."""
    return bool(_rows(src, "SELECT 1 AS x FROM kv WHERE scope = :s LIMIT 1", {"s": scope}))


def put(tx: Tx, scope: str, key: str, value: str, now: int | None = None) -> None:
    """Write ``value`` under ``(scope, key)``, replacing what was there."""
    tx.execute(_PUT, {"s": scope, "k": key, "v": value, "now": now_ms() if now is None else now})


def add(tx: Tx, scope: str, key: str, value: str, now: int | None = None) -> bool:
    """Write ``value`` under ``(scope, key)`` unless a row is there already. True when written."""
    cur = tx.execute(_ADD, {"s": scope, "k": key, "v": value, "now": now_ms() if now is None else now})
    return bool(cur.rowcount)


def delete(tx: Tx, scope: str, key: str) -> int:
    """Remove one row; returns how many were removed (0 or 1)."""
    return int(tx.execute(_DELETE, {"s": scope, "k": key}).rowcount)


def delete_scope(tx: Tx, scope: str, *, prefix: str | None = None) -> int:
    """Remove every row of a scope (only keys starting with ``prefix`` when given)."""
    params: dict[str, Any] = {"s": scope}
    sql = "DELETE FROM kv WHERE scope = :s" + _prefix_condition(prefix, params)
    return int(tx.execute(sql, params).rowcount)


def delete_older(tx: Tx, scope: str, before: int, *, family: bool = False) -> int:
    """Remove the rows of ``scope`` last written before ``before`` (epoch ms). With ``family``, ``scope`` is a
    family prefix (a :class:`Scope` ending in ``:`` or ``.``) and every member scope is pruned."""
    if family:
        params: dict[str, Any] = {"lo": scope, "hi": _after_prefix(scope), "cut": before}
        sql = "DELETE FROM kv WHERE scope >= :lo AND scope < :hi AND updated_at < :cut"
    else:
        params = {"s": scope, "cut": before}
        sql = "DELETE FROM kv WHERE scope = :s AND updated_at < :cut"
    return int(tx.execute(sql, params).rowcount)


def _prefix_condition(prefix: str | None, params: dict[str, Any]) -> str:
    # A key range instead of LIKE: it uses the (scope, key) primary key and needs no escaping of '%' or '_'.
    if not prefix:
        return ""
    params["lo"], params["hi"] = prefix, _after_prefix(prefix)
    return " AND key >= :lo AND key < :hi"


def _after_prefix(prefix: str) -> str:
    """The smallest string greater than every string starting with ``prefix``."""
    return prefix + "\U0010ffff"


def _entry(row: Row) -> Entry:
    return Entry(str(row["key"]), str(row["value"]), int(row["updated_at"]))
