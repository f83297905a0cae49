"""``responses``: the outbox, replies claimed per channel, delivered chunk by chunk, acked or failed
(:mod:`shared.queue.delivery`; the one-statement completion of :mod:`shared.queue.messages` writes its
reply with :data:`RESPONSE_COLUMNS`)."""

from __future__ import annotations

from shared.storage.statuses import ResponseStatus

#: The columns a new response is written with (here and in the one-statement completion).
RESPONSE_COLUMNS = (
    "message_id, channel, sender, sender_id, message, original_message, agent, files, metadata, status, "
    "created_at, updated_at, conversation, delivered"
)
INSERT = (
    f"INSERT INTO responses ({RESPONSE_COLUMNS}) VALUES (:message_id, :channel, "
    f":sender, :sender_id, :message, :original_message, :agent, :files, :metadata, '{ResponseStatus.PENDING}', :now, :now, "
    ":conversation, 0)"
)
ROW = "SELECT * FROM responses WHERE id = :id"
STATUS = "SELECT status FROM responses WHERE id = :id"


def _claim(gone: str) -> str:
    return (
        f"UPDATE responses SET status = '{ResponseStatus.DELIVERING}', claimed_by = :worker, lease_until = :lease, updated_at = :now "
        f"WHERE id IN (SELECT r.id FROM responses r WHERE r.status <> '{ResponseStatus.ACKED}' AND r.channel = :channel "
        f"AND r.status IN ('{ResponseStatus.PENDING}', '{ResponseStatus.DELIVERING}') "
        f"AND (r.lease_until IS NULL OR r.lease_until <= :now{gone}) "
        # The head of its chat: no earlier unfinished response of the same conversation (pending, waiting
        # to retry, or being delivered by anyone). `status <> 'acked'` repeats the partial index's condition.
        f"AND (r.conversation = '' OR NOT EXISTS (SELECT 1 FROM responses e WHERE e.status <> '{ResponseStatus.ACKED}' "
        "AND e.channel = r.channel AND e.conversation = r.conversation AND e.id < r.id "
        f"AND e.status IN ('{ResponseStatus.PENDING}', '{ResponseStatus.DELIVERING}'))) "
        "ORDER BY r.id LIMIT :limit{skip_locked}) RETURNING *"
    )


#: Up to ``:limit`` responses of ``:channel`` for ``:worker``, at most one per chat: the oldest unfinished
#: one of each chat, when it is free (pending and due, or its deliverer's lease expired).
CLAIM = _claim("")


def claim_taking_over(holders: int) -> str:
    """:data:`CLAIM`, where a response held by one of ``holders`` known-dead workers (``:gone0``,
    ``:gone1``, …) is free although its lease has not run out (still fenced by claimed_by: a holder that
    renewed since keeps it)."""
    names = ", ".join(f":gone{i}" for i in range(holders))
    return _claim(f" OR (r.status = '{ResponseStatus.DELIVERING}' AND r.claimed_by IN ({names}))")


#: Whether ``:channel`` has a response a claim could take by its lease alone (a cheap read first).
CLAIMABLE = (
    f"SELECT 1 FROM responses WHERE status <> '{ResponseStatus.ACKED}' AND channel = :channel "
    f"AND status IN ('{ResponseStatus.PENDING}', '{ResponseStatus.DELIVERING}') AND (lease_until IS NULL OR lease_until <= :now) LIMIT 1"
)
#: The workers holding responses of ``:channel`` under a running lease.
HOLDERS_UNDER_LEASE = (
    f"SELECT DISTINCT claimed_by FROM responses WHERE status <> '{ResponseStatus.ACKED}' AND channel = :channel "
    f"AND status = '{ResponseStatus.DELIVERING}' AND lease_until > :now AND claimed_by IS NOT NULL"
)
#: Chunk ``:index`` sent: the next is ``:next``, and the lease runs on (only while ``:worker`` holds it).
MARK_CHUNK_DELIVERED = (
    "UPDATE responses SET delivered = :next, lease_until = :lease, updated_at = :now WHERE id = :id "
    f"AND claimed_by = :worker AND status = '{ResponseStatus.DELIVERING}' AND delivered = :index "
    "RETURNING message_id, channel"
)
#: Failed responses stay failed: an ack arriving late must not turn them into "delivered".
ACK = (
    f"UPDATE responses SET status = '{ResponseStatus.ACKED}', acked_at = :now, updated_at = :now, lease_until = NULL "
    f"WHERE id = :id AND status <> '{ResponseStatus.ACKED}' AND status <> '{ResponseStatus.FAILED}' RETURNING message_id"
)
#: :data:`ACK`, only while ``:worker`` holds the response.
ACK_HELD = (
    f"UPDATE responses SET status = '{ResponseStatus.ACKED}', acked_at = :now, updated_at = :now, lease_until = NULL "
    f"WHERE id = :id AND status <> '{ResponseStatus.ACKED}' AND status <> '{ResponseStatus.FAILED}' AND claimed_by = :worker RETURNING message_id"
)
RENEW_LEASE = (
    "UPDATE responses SET lease_until = :lease WHERE id = :id AND claimed_by = :worker "
    f"AND status = '{ResponseStatus.DELIVERING}'"
)
#: Locked (PostgreSQL): a takeover racing this waits, or has happened and the row is not held.
HELD_LOCKED = (
    "SELECT message_id FROM responses WHERE id = :id AND claimed_by = :worker "
    f"AND status = '{ResponseStatus.DELIVERING}'{{lock_rows}}"
)
#: Given back at a clean shutdown: due at once, no attempt counted.
GIVE_BACK = (
    f"UPDATE responses SET status = '{ResponseStatus.PENDING}', claimed_by = NULL, lease_until = NULL, "
    "updated_at = :now WHERE id = :id"
)
#: Given back after a transient send error: pending again, due at ``:due``.
RETRY_LATER = (
    f"UPDATE responses SET status = '{ResponseStatus.PENDING}', claimed_by = NULL, lease_until = :due, "
    "updated_at = :now, last_error = :error WHERE id = :id"
)
#: Undeliverable for good, whoever holds it (also after it was acked: a platform reporting a failure later).
FAIL = (
    f"UPDATE responses SET status = '{ResponseStatus.FAILED}', last_error = :reason, lease_until = NULL, "
    f"updated_at = :now WHERE id = :id AND status <> '{ResponseStatus.FAILED}' "
    "RETURNING message_id, channel, conversation, created_at"
)
#: :data:`FAIL`, only while ``:worker`` delivers the response.
FAIL_HELD = (
    f"UPDATE responses SET status = '{ResponseStatus.FAILED}', last_error = :reason, lease_until = NULL, "
    f"updated_at = :now WHERE id = :id AND status <> '{ResponseStatus.FAILED}' AND claimed_by = :worker AND status = '{ResponseStatus.DELIVERING}' "
    "RETURNING message_id, channel, conversation, created_at"
)
#: When the message a reply answers was sent (the user knows their message by it).
MESSAGE_CREATED_AT = "SELECT created_at FROM messages WHERE message_id = :m"
FAILED = (
    f"SELECT * FROM responses WHERE status <> '{ResponseStatus.ACKED}' AND status = '{ResponseStatus.FAILED}' AND updated_at >= :since "
    "ORDER BY id DESC LIMIT :limit"
)
FAILED_COUNT = (
    f"SELECT COUNT(*) FROM responses WHERE status <> '{ResponseStatus.ACKED}' AND status = '{ResponseStatus.FAILED}' "
    "AND updated_at >= :since"
)
