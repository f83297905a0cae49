"""Messages a channel took in late: sent while its adapter was down, handed over by the platform after a
restart. The adapter marks such a message (``messages.metadata.offline_sent_at``, set by
:mod:`adapters.intake`); when its reply is delivered, :func:`offline_sent_at` tells when it was sent, so the
reply can say it arrived while agentpost was offline.
"""

from __future__ import annotations

import json

from shared.queue.reports import message_metadata
from shared.storage.db import Database

#: Metadata key of an inbound message the platform handed over late (after a restart): when it was sent.
OFFLINE_SENT_AT = "offline_sent_at"


def offline_sent_at(db: Database, message_id: str) -> int | None:
    """When the message ``message_id`` was sent, if it reached us only after a restart; else None."""
    raw = message_metadata(db, message_id)
    if not raw:
        return None
    try:
        value = json.loads(str(raw)).get(OFFLINE_SENT_AT)
    except (ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int | float) and value > 0 else None
