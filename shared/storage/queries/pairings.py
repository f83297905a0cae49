"""``pairings``: who a channel's operator has approved (or was handed a code) (:mod:`shared.chat.pairings`)."""

from __future__ import annotations

from shared.storage.statuses import PairingStatus

_PENDING = f"'{PairingStatus.PENDING}'"

STATUS = "SELECT status FROM pairings WHERE channel = :c AND sender_id = :s"
FIND = "SELECT * FROM pairings WHERE channel = :c AND sender_id = :s"
#: How many of the channel's codes are pending and were issued at or after ``:since``.
PENDING_SINCE = (
    f"SELECT COUNT(*) FROM pairings WHERE channel = :c AND status = {_PENDING} AND created_at >= :since"
)
#: A new pending code for the sender, replacing an expired code or a revoked pairing.
ISSUE = (
    "INSERT INTO pairings (channel, sender_id, sender, code, status, created_at, approved_at) "
    f"VALUES (:c, :s, :n, :code, {_PENDING}, :now, NULL) ON CONFLICT (channel, sender_id) DO UPDATE SET "
    f"sender = excluded.sender, code = excluded.code, status = {_PENDING}, created_at = excluded.created_at, "
    "approved_at = NULL"
)
#: The newest pending pairing with ``:code``, locked for its approval.
PENDING_BY_CODE_LOCKED = (
    f"SELECT * FROM pairings WHERE code = :code AND status = {_PENDING} ORDER BY created_at DESC{{lock_rows}}"
)
APPROVE = (
    f"UPDATE pairings SET status = '{PairingStatus.APPROVED}', approved_at = :now "
    "WHERE channel = :c AND sender_id = :s"
)
REVOKE = "UPDATE pairings SET status = 'revoked' WHERE channel = :c AND sender_id = :s"
ALL_NEWEST_FIRST = "SELECT * FROM pairings ORDER BY created_at DESC, id DESC"
OF_CHANNEL_NEWEST_FIRST = "SELECT * FROM pairings WHERE channel = :c ORDER BY created_at DESC, id DESC"
