"""The ``kv`` store's named statements (:mod:`shared.storage.kv`), on SQLite and PostgreSQL: reads, writes, prefix
ranges, pruning of single scopes and of families; and the two kinds of rows that used to leak (legacy
``handled:<channel>`` dedupe rows, delivery-attempt counts of settled replies)."""

from __future__ import annotations

import pytest

from shared.chat import dedupe
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue.core import Queue
from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Entry, Scope, scoped

pytestmark = pytest.mark.integration

T0 = 1_700_000_000_000


def _put(db: Database, scope: str, key: str, value: str, now: int = T0) -> None:
    with db.transaction() as tx:
        kv.put(tx, scope, key, value, now)


def _keys(db: Database, scope: str, **kwargs: object) -> list[str]:
    return [e.key for e in kv.entries(db, scope, **kwargs)]  # type: ignore[arg-type]


# -- scopes ---------------------------------------------------------------------------------------------------
# -- single rows ----------------------------------------------------------------------------------------------
def test_get_put_get_entry_and_delete(db: Database) -> None:
    assert kv.get(db, Scope.AGENT_RUN, "alpha") is None
    assert kv.get_entry(db, Scope.AGENT_RUN, "alpha") is None
    _put(db, Scope.AGENT_RUN, "alpha", "one", T0)
    _put(db, Scope.AGENT_RUN, "alpha", "two", T0 + 5)  # replaces value and time
    _put(db, Scope.BUSY_POLICY, "alpha", "other scope", T0)
    assert kv.get(db, Scope.AGENT_RUN, "alpha") == "two"
    assert kv.get_entry(db, Scope.AGENT_RUN, "alpha") == Entry("alpha", "two", T0 + 5)
    with db.transaction() as tx:
        assert kv.get(tx, Scope.AGENT_RUN, "alpha") == "two"  # also inside a transaction
        assert kv.delete(tx, Scope.AGENT_RUN, "alpha") == 1
        assert kv.delete(tx, Scope.AGENT_RUN, "alpha") == 0
    assert kv.get(db, Scope.AGENT_RUN, "alpha") is None
    assert kv.get(db, Scope.BUSY_POLICY, "alpha") == "other scope"


def test_add_keeps_the_first_value(db: Database) -> None:
    with db.transaction() as tx:
        assert kv.add(tx, Scope.DLQ_RESTORED, "m@1", "first", T0)
        assert not kv.add(tx, Scope.DLQ_RESTORED, "m@1", "second", T0 + 1)
    assert kv.get_entry(db, Scope.DLQ_RESTORED, "m@1") == Entry("m@1", "first", T0)


def test_replace_changes_only_an_existing_value_and_keeps_its_time(db: Database) -> None:
    scope = scoped(Scope.INBOUND_JOBS, "whatsapp")
    _put(db, scope, "j1", "v1", T0)
    with db.transaction() as tx:
        assert kv.replace(tx, scope, "j1", "v2")
        assert not kv.replace(tx, scope, "missing", "v")
    assert kv.get_entry(db, scope, "j1") == Entry("j1", "v2", T0)
    assert kv.get(db, scope, "missing") is None


def test_put_max_moves_forward_only_as_text_or_as_numbers(db: Database) -> None:
    cursors = scoped(Scope.CURSOR, "discord")
    with db.transaction() as tx:
        assert kv.put_max(tx, cursors, "c", "00000000000000000009|a", T0)
        assert kv.put_max(tx, cursors, "c", "00000000000000000010|b", T0 + 1)
        assert not kv.put_max(tx, cursors, "c", "00000000000000000008|c", T0 + 2)
    assert kv.get_entry(db, cursors, "c") == Entry("c", "00000000000000000010|b", T0 + 1)
    with db.transaction() as tx:
        assert kv.put_max(tx, Scope.EVENTS_PRUNED, "*", "9", T0, numeric=True)
        # As text "10" < "9"; as numbers it is larger and must win.
        assert kv.put_max(tx, Scope.EVENTS_PRUNED, "*", "10", T0 + 1, numeric=True)
        assert not kv.put_max(tx, Scope.EVENTS_PRUNED, "*", "9", T0 + 2, numeric=True)
    assert kv.get(db, Scope.EVENTS_PRUNED, "*") == "10"


def test_get_many_and_delete_keys_across_chunks(db: Database) -> None:
    keys = [f"r{i:04d}" for i in range(1_200)]  # more than one statement's worth of keys
    with db.transaction() as tx:
        for i, key in enumerate(keys):
            if i % 3:
                kv.put(tx, Scope.DELIVERY_ATTEMPTS, key, str(i), T0)
        kv.put(tx, Scope.CHAIN_RUNS, "r0001", "other scope", T0)
    found = kv.get_many(db, Scope.DELIVERY_ATTEMPTS, [*keys, "r0001", "nope"])
    assert found == {k: str(i) for i, k in enumerate(keys) if i % 3}
    assert kv.get_many(db, Scope.DELIVERY_ATTEMPTS, []) == {}
    with db.transaction() as tx:
        assert kv.delete_keys(tx, Scope.DELIVERY_ATTEMPTS, keys[:900]) == sum(1 for i in range(900) if i % 3)
        assert kv.delete_keys(tx, Scope.DELIVERY_ATTEMPTS, []) == 0
    assert sorted(kv.get_many(db, Scope.DELIVERY_ATTEMPTS, keys)) == [
        k for i, k in enumerate(keys) if i >= 900 and i % 3
    ]
    assert kv.get(db, Scope.CHAIN_RUNS, "r0001") == "other scope"


# -- listings and prefix ranges -------------------------------------------------------------------------------
def test_entries_by_key_by_time_by_prefix_and_since(db: Database) -> None:
    scope = Scope.CHAT_AGENTS
    _put(db, scope, "t:1|beta", "beta", T0 + 2)
    _put(db, scope, "t:1|alpha", "alpha", T0 + 3)
    _put(db, scope, "t:10|alpha", "alpha", T0 + 1)  # shares "t:1" but not the prefix "t:1|"
    _put(db, scope, "t:1", "bare", T0)  # the prefix without anything after it is not in the range
    _put(db, scope, "t:1|", "empty rest", T0)  # the prefix itself is
    _put(db, scope, "t:1|é", "non-ascii", T0 + 4)
    _put(db, Scope.CHAIN_RUNS, "t:1|alpha", "other scope", T0)
    # Keys compare as code points: "0" sorts before "|".
    assert _keys(db, scope) == ["t:1", "t:10|alpha", "t:1|", "t:1|alpha", "t:1|beta", "t:1|é"]
    assert _keys(db, scope, prefix="t:1|") == ["t:1|", "t:1|alpha", "t:1|beta", "t:1|é"]
    assert _keys(db, scope, prefix="t:1|", since=T0 + 3) == ["t:1|alpha", "t:1|é"]
    assert _keys(db, scope, by_time=True) == ["t:1", "t:1|", "t:10|alpha", "t:1|beta", "t:1|alpha", "t:1|é"]
    assert _keys(db, scope, prefix="x") == []
    # A prefix with LIKE's wildcards in it matches them literally.
    _put(db, scope, "a%b", "1")
    _put(db, scope, "axb", "2")
    assert _keys(db, scope, prefix="a%") == ["a%b"]
    assert kv.entries(db, scope, prefix="t:1|b") == [Entry("t:1|beta", "beta", T0 + 2)]


def test_any_in(db: Database) -> None:
    notices = scoped(Scope.UNDELIVERED, "telegram:42")
    assert not kv.any_in(db, notices)
    _put(db, scoped(Scope.UNDELIVERED, "telegram:420"), "1", "x")
    assert not kv.any_in(db, notices)
    _put(db, notices, "1", "x")
    assert kv.any_in(db, notices)


def test_delete_scope_whole_and_by_prefix(db: Database) -> None:
    scope = scoped(Scope.HELD, "telegram")
    for key in ("a1", "a2", "b1"):
        _put(db, scope, key, "[]")
    _put(db, scoped(Scope.HELD, "discord"), "a1", "[]")
    with db.transaction() as tx:
        assert kv.delete_scope(tx, scope, prefix="a") == 2
    assert _keys(db, scope) == ["b1"]
    with db.transaction() as tx:
        assert kv.delete_scope(tx, scope) == 1
    assert _keys(db, scope) == []
    assert _keys(db, scoped(Scope.HELD, "discord")) == ["a1"]


# -- pruning --------------------------------------------------------------------------------------------------
def test_delete_older_one_scope_and_a_key_prefix(db: Database) -> None:
    _put(db, Scope.CHAIN_RUNS, "old", "1", T0)
    _put(db, Scope.CHAIN_RUNS, "new", "1", T0 + 10)
    _put(db, Scope.CHAT_AGENTS, "old", "1", T0)
    with db.transaction() as tx:
        assert kv.delete_older(tx, Scope.CHAIN_RUNS, T0 + 10) == 1  # strictly older than the cut
    assert _keys(db, Scope.CHAIN_RUNS) == ["new"]
    assert _keys(db, Scope.CHAT_AGENTS) == ["old"]
    _put(db, Scope.CHAT_AGENTS, "c1|a", "a", T0)
    _put(db, Scope.CHAT_AGENTS, "c1|b", "b", T0 + 10)
    _put(db, Scope.CHAT_AGENTS, "c2|a", "a", T0)
    with db.transaction() as tx:
        assert kv.delete_older(tx, Scope.CHAT_AGENTS, T0 + 5, prefix="c1|") == 1
    assert _keys(db, Scope.CHAT_AGENTS) == ["c1|b", "c2|a", "old"]


def test_delete_older_family_prunes_every_member_scope_and_nothing_else(db: Database) -> None:
    for scope in ("held:telegram", "held:discord", "held:"):
        _put(db, scope, "old", "[]", T0)
        _put(db, scope, "new", "[]", T0 + 10)
    # Neighbours of the family: no ':' after "held", or another family altogether.
    for scope in ("held", "heldx:telegram", "pairing_reminded:telegram", "hel"):
        _put(db, scope, "old", "1", T0)
    with db.transaction() as tx:
        assert kv.delete_older(tx, Scope.HELD, T0 + 5, family=True) == 3
    for scope in ("held:telegram", "held:discord", "held:"):
        assert _keys(db, scope) == ["new"]
    for scope in ("held", "heldx:telegram", "pairing_reminded:telegram", "hel"):
        assert _keys(db, scope) == ["old"]
    # A family completed in part (every chat of one channel) is a family too.
    _put(db, "undelivered:telegram:1", "5", "{}", T0)
    _put(db, "undelivered:telegram:2", "6", "{}", T0)
    _put(db, "undelivered:telegramx:1", "7", "{}", T0)
    with db.transaction() as tx:
        assert kv.delete_older(tx, "undelivered:telegram:", T0 + 5, family=True) == 2
    assert _keys(db, "undelivered:telegramx:1") == ["7"]


def test_approved_sender_entries_joins_approved_pairings_of_the_channel(db: Database) -> None:
    held = scoped(Scope.HELD, "telegram")
    for sender in ("u1", "u2", "u3"):
        _put(db, held, sender, f'[{{"external_id": "{sender}"}}]')
    with db.transaction() as tx:
        for channel, sender, status in (
            ("telegram", "u1", "approved"),
            ("telegram", "u2", "pending"),
            ("discord", "u3", "approved"),  # approved elsewhere only
        ):
            tx.execute(
                "INSERT INTO pairings (channel, sender_id, sender, code, status, created_at, approved_at) "
                "VALUES (:c, :s, :s, :code, :st, :now, :now)",
                {"c": channel, "s": sender, "code": f"code-{channel}-{sender}", "st": status, "now": T0},
            )
    found = kv.approved_sender_entries(db, held, "telegram")
    assert [(e.key, e.value) for e in found] == [("u1", '[{"external_id": "u1"}]')]


# -- rows that used to leak -----------------------------------------------------------------------------------
def test_dedupe_prune_removes_legacy_handled_rows_of_every_channel_once_past_the_window(db: Database) -> None:
    now = now_ms()
    old, recent = now - dedupe.RETENTION_MS - 60_000, now - 60_000
    _put(db, "handled:telegram", "m-old", "1", old)
    _put(db, "handled:telegram", "m-recent", "1", recent)
    _put(db, "handled:gone-channel", "m-old", "1", old)  # a channel nobody prunes any more
    _put(db, "seen:telegram", "s-old", "1", old)
    _put(db, "seen:discord", "s-old", "1", old)  # another channel's current rows wait for its own prune
    # Legacy rows are still honoured until they go.
    assert dedupe.is_seen(db, "telegram", "m-old")
    assert dedupe.is_seen(db, "telegram", "m-recent")
    assert dedupe.prune(db, "telegram") == 3
    assert not dedupe.is_seen(db, "telegram", "m-old")
    assert dedupe.is_seen(db, "telegram", "m-recent")
    assert _keys(db, "handled:gone-channel") == []
    assert _keys(db, "seen:telegram") == []
    assert _keys(db, "seen:discord") == ["s-old"]
    dedupe.remember(db, "telegram", "fresh")
    assert dedupe.is_seen(db, "telegram", "fresh")
    assert not dedupe.is_seen(db, "discord", "fresh")


def _attempts(queue: Queue, response_id: int) -> str | None:
    return kv.get(queue.db, Scope.DELIVERY_ATTEMPTS, str(response_id))


def _retry_once(queue: Queue, response_id: int) -> None:
    [claimed] = queue.responses.claim_responses_for_channel("telegram", "d1", limit=10)
    assert claimed.id == response_id
    outcome = queue.responses.retry_response_later(response_id, "d1", "timeout", base_ms=0, max_ms=0)
    assert outcome is not None and not outcome.failed
    assert _attempts(queue, response_id) == "1"


def test_delivery_attempts_go_when_the_reply_is_acked(queue: Queue) -> None:
    rid = queue.responses.enqueue_response(ChatAddress("telegram", "ann", conversation="c1"), "hello").id
    _retry_once(queue, rid)
    [again] = queue.responses.claim_responses_for_channel("telegram", "d2", limit=10)
    assert again.id == rid
    assert queue.responses.ack_response(rid, "d2")
    assert _attempts(queue, rid) is None


def test_delivery_attempts_go_when_the_reply_is_failed(queue: Queue) -> None:
    rid = queue.responses.enqueue_response(ChatAddress("telegram", "ann", conversation="c1"), "hello").id
    _retry_once(queue, rid)
    assert queue.responses.fail_response(rid, "blocked by the user")
    assert _attempts(queue, rid) is None


def test_delivery_attempts_of_a_reply_acked_elsewhere_go_by_ack_or_prune(queue: Queue) -> None:
    first = queue.responses.enqueue_response(ChatAddress("telegram", "ann", conversation="c1"), "one").id
    second = queue.responses.enqueue_response(ChatAddress("telegram", "ann", conversation="c2"), "two").id
    claimed = queue.responses.claim_responses_for_channel("telegram", "d1", limit=10)
    assert sorted(r.id for r in claimed) == [first, second]  # the heads of two chats
    for rid in (first, second):
        assert (
            queue.responses.retry_response_later(rid, "d1", "timeout", base_ms=60_000, max_ms=60_000)
            is not None
        )
        assert _attempts(queue, rid) == "1"
    # Settled without ack_response (as the scheduler acknowledges replies on unserved channels).
    with queue.db.transaction() as tx:
        tx.execute(
            "UPDATE responses SET status = 'acked', acked_at = :t, lease_until = NULL WHERE id IN (:a, :b)",
            {"t": now_ms() - 10 * 86_400_000, "a": first, "b": second},
        )
    assert queue.responses.ack_response(first)  # an operator's late ack of an acked reply
    assert _attempts(queue, first) is None
    assert _attempts(queue, second) == "1"
    assert queue.admin.prune()["responses"] == 2
    assert _attempts(queue, second) is None
