"""``approvals``: tool uses a run asks a person about (:mod:`shared.chat.approvals`)."""

from __future__ import annotations

from shared.storage.statuses import ApprovalStatus

_PENDING = f"'{ApprovalStatus.PENDING}'"

INSERT = (
    "INSERT INTO approvals (id, message_id, run_id, agent, channel, conversation, sender_id, sender, tool, "
    "summary, detail, pattern, status, decided_by, decided_via, for_chat, shown_id, created_at, expires_at, "
    "decided_at) VALUES (:id, :message_id, :run_id, :agent, :channel, :conversation, :sender_id, :sender, "
    f":tool, :summary, :detail, :pattern, {_PENDING}, '', '', 0, '', :now, :expires_at, 0)"
)
GET = "SELECT * FROM approvals WHERE id = :id"
GET_LOCKED = "SELECT * FROM approvals WHERE id = :id{lock_rows}"
#: An answer lands only on a request that still waits: applied at most once, whoever answers first.
DECIDE = (
    "UPDATE approvals SET status = :status, decided_by = :by, decided_via = :via, for_chat = :for_chat, "
    f"decided_at = :now WHERE id = :id AND status = {_PENDING}"
)
#: The requests of ``:message_id`` that still wait (a run started again asks them anew).
PENDING_OF_MESSAGE = (
    f"SELECT * FROM approvals WHERE message_id = :message_id AND status = {_PENDING}{{lock_rows}}"
)
#: Requests still waiting past ``:before`` (their time plus a grace), the earliest due first.
OVERDUE = (
    f"SELECT * FROM approvals WHERE status = {_PENDING} AND expires_at < :before ORDER BY expires_at, id "
    "LIMIT :limit{lock_rows}"
)
#: Every request that waits, oldest first (the partial index of pending rows).
PENDING_OLDEST_FIRST = f"SELECT * FROM approvals WHERE status = {_PENDING} ORDER BY created_at, id"
#: The requests of one chat that wait for ``:sender_id``, oldest first (``/allow`` and ``/deny``).
PENDING_IN_CHAT = (
    f"SELECT * FROM approvals WHERE status = {_PENDING} AND channel = :channel AND conversation = :conversation "
    "ORDER BY created_at, id"
)
#: The latest requests, whatever became of them (``agentpost approvals list --all``).
RECENT = "SELECT * FROM approvals ORDER BY created_at DESC, id DESC LIMIT :limit"
SHOWN = "UPDATE approvals SET shown_id = :shown_id WHERE id = :id"
