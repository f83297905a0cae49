"""``messages``: claims, completions and the leases of claimed groups (:mod:`shared.queue.messages`,
:mod:`shared.queue.leases`), with the rows a completion writes beside them (``chat_messages``,
``agent_messages``).

A group of claimed messages is named by its message ids ``:m0``, ``:m1``, … (as
:func:`shared.queue.records.sql_in` names them with prefix ``m``); the statements over a group are functions of
its size, built once per size.
"""

from __future__ import annotations

from functools import lru_cache

from shared.storage.queries.agent_leases import take_lease, take_new_lease
from shared.storage.queries.common import CHAT_KEY, PENDING, PROCESSING
from shared.storage.queries.responses import RESPONSE_COLUMNS
from shared.storage.statuses import MessageStatus, ResponseStatus

_COMPLETED = f"'{MessageStatus.COMPLETED}'"


def _group(count: int) -> str:
    """``(:m0, :m1, …)``: the message ids of a group of ``count``."""
    return "(" + ", ".join(f":m{i}" for i in range(count)) + ")"


#: What a claim reads back of each row: every column except those the claim sets (see
#: ``QueuedMessage.from_claim``); ``id`` first and ``message_id`` second, as the claim relies on.
CLAIM_RETURNS = (
    "id, message_id, channel, sender, sender_id, message, from_agent, retry_count, manual_retries, "
    "last_error, created_at, conversation, metadata, available_at, hops, external_id, interruptions"
)

# -- claim ------------------------------------------------------------------------------------------------

#: Agents with at least one message available at ``:now``.
AGENTS_WITH_PENDING = f"SELECT DISTINCT agent FROM messages WHERE status = {PENDING} AND available_at <= :now"
#: When the earliest pending message becomes available.
NEXT_AVAILABLE_AT = f"SELECT MIN(available_at) FROM messages WHERE status = {PENDING}"

#: Whether a claim of the agent by ``:worker`` could take anything now: a message available, and the agent's
#: lease free, expired or the worker's own, and the agent not paused (the conditions of
#: :data:`~shared.storage.queries.agent_leases.TAKE_LEASE`).
CLAIM_PROBE = (
    f"SELECT 1 FROM messages WHERE status = {PENDING} AND agent = :agent AND available_at <= :now "
    "AND NOT EXISTS (SELECT 1 FROM agent_leases WHERE agent = :agent AND (paused_until > :now OR "
    "(holder IS NOT NULL AND holder <> :worker AND lease_until >= :now))) LIMIT 1"
)

#: Every available pending message of ``:agent`` claimed by ``:worker`` until ``:lease``, oldest first
#: (claimers skip each other's rows on PostgreSQL).
CLAIM_PENDING = (
    f"UPDATE messages SET status = {PROCESSING}, claimed_by = :worker, lease_until = :lease, "
    "updated_at = :now, run_started_at = NULL WHERE id IN (SELECT id FROM messages WHERE "
    f"status = {PENDING} AND agent = :agent AND available_at <= :now ORDER BY id{{skip_locked}}) "
    f"RETURNING {CLAIM_RETURNS}"
)

_AVAILABLE = (
    f" AND EXISTS (SELECT 1 FROM messages WHERE status = {PENDING} AND agent = :agent "
    "AND available_at <= :now)"
)
#: The one-statement claim's writes (Dialect.write_with_events): the agent's lease taken only when a message
#: is available (so a claim of an agent with nothing to take changes nothing), then every available message
#: of the agent claimed under it, oldest first, as :data:`CLAIM_PENDING` does.
CLAIM_CTES = (
    f"taken AS ({take_lease(_AVAILABLE)} RETURNING agent), "
    f"taken_new AS ({take_new_lease(_AVAILABLE)} RETURNING agent), "
    f"claimed AS (UPDATE messages SET status = {PROCESSING}, claimed_by = :worker, "
    "lease_until = :lease, updated_at = :now, run_started_at = NULL WHERE id IN (SELECT id FROM messages "
    f"WHERE status = {PENDING} AND agent = :agent AND available_at <= :now AND EXISTS "
    "(SELECT 1 FROM taken UNION ALL SELECT 1 FROM taken_new) ORDER BY id{skip_locked}) "
    f"RETURNING {CLAIM_RETURNS})"
)
#: The one-statement claim's event: ``message_claimed`` with the claimed ids in id order (the oldest names it).
CLAIMED_EVENT = (
    "SELECT 0, 'queue', 'message_claimed', (SELECT message_id FROM claimed ORDER BY id LIMIT 1), "
    "CAST(json_build_object('agent', CAST(:agent AS text), 'worker', CAST(:worker AS text), 'message_ids', "
    "json_agg(message_id ORDER BY id)) AS text) FROM claimed HAVING COUNT(*) > 0"
)
#: Whether the lease was taken, then the claimed rows; one row of NULLs after ``leased`` when none was.
CLAIM_RESULT = (
    "SELECT (SELECT COUNT(*) FROM taken) + (SELECT COUNT(*) FROM taken_new) AS leased, claimed.* "
    "FROM (SELECT 1) AS one LEFT JOIN claimed ON TRUE"
)

_CHAT_WAITING = (
    f"status = {PENDING} AND agent = :agent AND channel = :channel "
    f"AND {CHAT_KEY} = :conv AND available_at <= :now"
)
#: Whether a message of the chat (``:channel``, ``:conv`` by the chat key) waits for ``:agent`` at ``:now``.
CHAT_WAITING = f"SELECT 1 FROM messages WHERE {_CHAT_WAITING} LIMIT 1"
#: Those messages claimed into the run going on, already marked as started.
CLAIM_CHAT_INTO_RUN = (
    f"UPDATE messages SET status = {PROCESSING}, claimed_by = :worker, "
    "lease_until = :lease, updated_at = :now, run_started_at = :now WHERE id IN (SELECT id FROM "
    f"messages WHERE {_CHAT_WAITING} ORDER BY id{{skip_locked}}) RETURNING {CLAIM_RETURNS}"
)

# -- a claimed group -----------------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def held_group(count: int, assignments: str = "", columns: str = "*") -> str:
    """The rows of a group of ``count`` that ``:worker`` still holds (their ``columns``); with ``assignments``
    (``col = :v, …``, such as :data:`COMPLETE_GROUP`) updated in the same statement."""
    held = f"WHERE message_id IN {_group(count)} AND status = {PROCESSING} AND claimed_by = :worker"
    if assignments:
        return f"UPDATE messages SET {assignments} {held} RETURNING {columns}"
    # Locked (PostgreSQL) for the updates the caller makes next: a recovery racing them waits. In id
    # order, as recovery locks them, so the two never wait for each other.
    return f"SELECT {columns} FROM messages {held} ORDER BY id{{lock_rows}}"


#: :func:`held_group`'s assignments and columns for a completion, and for the start of a run.
COMPLETE_GROUP = f"status = {_COMPLETED}, updated_at = :now, lease_until = NULL"
COMPLETE_GROUP_RETURNS = "id, message_id"
START_RUN = "run_started_at = :now"
START_RUN_RETURNS = "id"


@lru_cache(maxsize=64)
def renew_held(count: int) -> str:
    """The leases of a group of ``count`` extended to ``:lease`` where ``:worker`` still holds them."""
    return (
        f"UPDATE messages SET lease_until = :lease WHERE status = {PROCESSING} AND claimed_by = :worker "
        f"AND message_id IN {_group(count)}"
    )


#: What a completion reads of the group's first message, for the reply (the other rows give only their ids:
#: a group of 20 then converts 40 values instead of 160).
PRIMARY = (
    "SELECT id, message_id, agent, channel, sender, sender_id, message, conversation FROM messages "
    "WHERE id = :id"
)
#: A chat-room post of a completed run.
INSERT_CHAT_POST = "INSERT INTO chat_messages (team_id, from_agent, message, created_at) VALUES (:team, :agent, :message, :now)"
#: A turn of an agent's history, recorded with its completion.
INSERT_AGENT_TURN = (
    "INSERT INTO agent_messages (agent_id, role, channel, sender, message_id, content, created_at) "
    "VALUES (:agent, :role, :channel, :sender, :mid, :content, :now)"
)

# -- the one-statement completion (Dialect.write_with_events) ------------------------------------------------


@lru_cache(maxsize=64)
def complete_ctes(count: int) -> str:
    """The one-statement completion's writes for a group of ``count``: the group's rows this worker still
    holds, locked (in id order, as recovery locks them) so that none changes hands meanwhile; all of them
    completed only when they are every row asked for (``:wanted``); the reply to the oldest, as
    ``Responses.insert_response`` writes it (:data:`~shared.storage.queries.responses.RESPONSE_COLUMNS`); and, with
    ``:release``, the agent's lease given up when the worker holds no other message of the agent and none
    waits (as :data:`~shared.storage.queries.agent_leases.RELEASE_IF_IDLE`; this statement still sees the
    group as held)."""
    agent = "(SELECT agent FROM head)"
    return (
        f"held AS (SELECT id FROM messages WHERE message_id IN {_group(count)} AND status = {PROCESSING} "
        "AND claimed_by = :worker ORDER BY id{lock_rows}), "
        f"done AS (UPDATE messages SET status = {_COMPLETED}, updated_at = :now, lease_until = NULL "
        "WHERE id IN (SELECT id FROM held) AND (SELECT COUNT(*) FROM held) = :wanted "
        "RETURNING id, message_id, agent, channel, sender, sender_id, message, conversation), "
        "head AS (SELECT * FROM done ORDER BY id LIMIT 1), "
        f"reply AS (INSERT INTO responses ({RESPONSE_COLUMNS}) SELECT message_id, "
        "COALESCE(CAST(:channel AS text), channel), COALESCE(CAST(:sender AS text), sender), "
        "COALESCE(CAST(:sender_id AS text), sender_id), :message, message, agent, :files, :metadata, "
        f"'{ResponseStatus.PENDING}', :now, :now, COALESCE(CAST(:conversation AS text), conversation), 0 "
        "FROM head RETURNING id), "
        "freed AS (UPDATE agent_leases SET holder = NULL, lease_until = 0 WHERE CAST(:release AS boolean) "
        f"AND agent = {agent} AND holder = :worker AND NOT EXISTS (SELECT 1 FROM messages WHERE status = "
        f"{PENDING} AND agent = {agent} AND available_at <= :now) AND NOT EXISTS (SELECT 1 "
        f"FROM messages WHERE status = {PROCESSING} AND claimed_by = :worker AND agent = "
        f"{agent} AND id NOT IN (SELECT id FROM done)) RETURNING agent)"
    )


#: The one-statement completion's event: ``response_ready``, as the transaction path appends it.
COMPLETED_EVENT = (
    "SELECT 0, 'queue', 'response_ready', head.message_id, CAST(json_build_object('message_ids', (SELECT "
    "json_agg(message_id ORDER BY id) FROM done), 'response_id', reply.id, 'agent', head.agent, 'channel', "
    "COALESCE(CAST(:channel AS text), head.channel)) AS text) FROM head, reply"
)
#: How many of the group's rows the worker held, the response's id (NULL: nothing changed), whether the
#: lease was given up.
COMPLETE_RESULT = (
    "SELECT (SELECT COUNT(*) FROM held) AS held, (SELECT id FROM reply) AS response_id, "
    "(SELECT COUNT(*) FROM freed) AS released"
)
