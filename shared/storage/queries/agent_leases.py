"""``agent_leases``: one row per agent, holding its run lease, its pause and a stop request
(:mod:`shared.queue.control`, :mod:`shared.queue.leases`)."""

from __future__ import annotations

from shared.storage.queries.common import CHAT_KEY, PENDING, PROCESSING

ENSURE_ROW = (
    "INSERT INTO agent_leases (agent, holder, lease_until, acquired_at, paused_until, stop_requested, note) "
    "VALUES (:agent, NULL, 0, 0, 0, '', '') ON CONFLICT (agent) DO NOTHING"
)
#: Never shortens a pause already longer.
PAUSE = "UPDATE agent_leases SET paused_until = :until, note = :reason WHERE agent = :agent AND paused_until < :until"
RESUME = "UPDATE agent_leases SET paused_until = 0, note = '' WHERE agent = :agent"
ROW = "SELECT * FROM agent_leases WHERE agent = :a"
REQUEST_STOP = "UPDATE agent_leases SET stop_requested = :c WHERE agent = :agent"
STOP_REQUEST_OF_HOLDER = "SELECT stop_requested FROM agent_leases WHERE agent = :agent AND holder = :worker"
STOP_REQUEST_OF_HOLDER_LOCKED = (
    "SELECT stop_requested FROM agent_leases WHERE agent = :agent AND holder = :worker "
    "AND stop_requested <> ''{lock_rows}"
)
CLEAR_STOP_REQUEST = "UPDATE agent_leases SET stop_requested = '' WHERE agent = :agent"

#: Whether a message for the agent waits in a chat, available by ``:now`` (it interrupts that chat's run).
ARRIVAL_IN_CHAT = (
    f"SELECT 1 FROM messages WHERE status = {PENDING} AND agent = :a AND channel = :c "
    f"AND {CHAT_KEY} = :conv AND available_at <= :now LIMIT 1"
)
#: Messages waiting for the first time behind the agent's run, oldest first.
FIRST_WAITING = (
    "SELECT message_id, channel, sender, sender_id, conversation FROM messages "
    f"WHERE status = {PENDING} AND agent = :a AND retry_count = 0 ORDER BY id LIMIT :n"
)

# -- the run lease (shared.queue.leases; the claim and the completion take and give it up in their statements)


def take_lease(condition: str = "") -> str:
    """The UPDATE taking the lease of ``:agent`` for ``:worker`` until ``:lease`` when it is free, expired or
    already the worker's and the agent is not paused (and ``condition`` holds, `` AND …``); it skips a lease
    row another transaction is changing (PostgreSQL) instead of waiting for it."""
    return (
        "UPDATE agent_leases SET holder = :worker, lease_until = :lease, acquired_at = CASE WHEN "
        "holder = :worker THEN acquired_at ELSE :now END WHERE agent IN (SELECT agent FROM agent_leases "
        "WHERE agent = :agent AND paused_until <= :now AND (holder IS NULL OR holder = :worker OR "
        f"lease_until < :now){condition}{{skip_locked}})"
    )


def take_new_lease(condition: str = "") -> str:
    """The INSERT taking the lease of an agent never leased (no row yet; and ``condition`` holds). Inserted
    only when the statement sees no row: an INSERT meeting a row that another transaction is changing would
    wait for it."""
    return (
        "INSERT INTO agent_leases (agent, holder, lease_until, acquired_at, paused_until, stop_requested, "
        "note) SELECT :agent, :worker, :lease, :now, 0, '', '' WHERE NOT EXISTS (SELECT 1 FROM "
        f"agent_leases WHERE agent = :agent){condition} ON CONFLICT (agent) DO NOTHING"
    )


TAKE_LEASE = take_lease()
TAKE_NEW_LEASE = take_new_lease()
RELEASE = "UPDATE agent_leases SET holder = NULL, lease_until = 0 WHERE agent = :agent AND holder = :worker"
HOLDER = "SELECT holder, lease_until FROM agent_leases WHERE agent = :a"
RENEW = "UPDATE agent_leases SET lease_until = :lease WHERE agent = :agent AND holder = :worker"
#: Renewed only while the worker's lease is still running (a run taking on more messages of its chat).
RENEW_LIVE = (
    "UPDATE agent_leases SET lease_until = :lease WHERE agent = :agent AND holder = :worker "
    "AND lease_until >= :now"
)
#: Given up when the worker holds no other message of the agent and none waits. One statement (a round trip
#: on PostgreSQL, not three). Two probes, each on its partial index (pending; processing): one probe with OR
#: would scan the table, which keeps every completed message for a day.
RELEASE_IF_IDLE = (
    "UPDATE agent_leases SET holder = NULL, lease_until = 0 WHERE agent = :agent AND holder = :worker "
    f"AND NOT EXISTS (SELECT 1 FROM messages WHERE status = {PENDING} AND agent = :agent "
    f"AND available_at <= :now) AND NOT EXISTS (SELECT 1 FROM messages WHERE status = {PROCESSING} "
    "AND claimed_by = :worker AND agent = :agent)"
)
