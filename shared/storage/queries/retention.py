"""Retention: finished history deleted in small batches, each statement a short transaction of at most
``:n`` rows (:mod:`shared.queue.retention`). Every batch finds its rows through an index (a partial index of
one status, or the primary key from the oldest row), so a prune that finds nothing reads almost nothing and
one that finds a million rows never holds the write lock for more than one batch.
"""

from __future__ import annotations

from typing import Literal

from shared.storage.statuses import ApprovalStatus, MessageStatus, ResponseStatus

_ACKED = f"'{ResponseStatus.ACKED}'"

#: Completed messages last changed before ``:cut`` (pending, processing and dead rows never match).
PRUNE_COMPLETED_MESSAGES = (
    "DELETE FROM messages WHERE id IN (SELECT id FROM messages "
    f"WHERE status = '{MessageStatus.COMPLETED}' AND updated_at < :cut LIMIT :n)"
)
#: Replies delivered before ``:cut``; their ids, to drop their delivery-attempt counts with them.
PRUNE_ACKED_RESPONSES = (
    "DELETE FROM responses WHERE id IN (SELECT id FROM responses "
    f"WHERE status = {_ACKED} AND acked_at < :cut LIMIT :n) RETURNING id"
)
#: Failed deliveries stay a week for trace, doctor and the user's notice, then go; so do CLI replies nobody
#: read (`agentpost replies` shows them until then). ``status <> 'acked'`` lets the read use the small
#: partial index of undelivered replies instead of the whole table.
PRUNE_FAILED_RESPONSES = (
    "DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE status <> "
    f"{_ACKED} AND (status = '{ResponseStatus.FAILED}' OR (status = '{ResponseStatus.PENDING}' AND "
    "channel = 'cli')) AND updated_at < :cut LIMIT :n) RETURNING id"
)

#: The append-only tables pruned by age: team chat rooms, agents' turns, what runs cost.
HistoryTable = Literal["chat_messages", "agent_messages", "run_usage"]


def prune_oldest(table: HistoryTable) -> str:
    """Of the ``:n`` oldest rows of ``table`` (by id, which follows time), delete those created before
    ``:cut``. A batch that deletes fewer than ``:n`` has reached the young rows: nothing older waits behind
    it but the odd row written out of order, which goes once it is among the oldest."""
    return (
        f"DELETE FROM {table} WHERE id IN (SELECT id FROM {table} ORDER BY id LIMIT :n) AND created_at < :cut"
    )


#: Questions to a person settled (answered, timed out, cancelled) before ``:cut``; a pending one never
#: goes. Their ids are text, so no walk from the oldest id: the table holds only ``permission_mode = "ask"``
#: questions, few enough to read whole.
PRUNE_SETTLED_APPROVALS = (
    "DELETE FROM approvals WHERE id IN (SELECT id FROM approvals "
    f"WHERE status <> '{ApprovalStatus.PENDING}' AND created_at < :cut LIMIT :n)"
)
