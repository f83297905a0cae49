"""A message the platform handed over after a restart is found late by its metadata mark; others are not.
On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from shared.chat.address import ChatAddress
from shared.queue.core import Queue
from shared.reads import late_messages
from shared.reads.late_messages import OFFLINE_SENT_AT

pytestmark = pytest.mark.integration


def test_offline_sent_at_reads_the_late_mark_of_a_message(queue: Queue) -> None:
    late = queue.intake.enqueue_message(
        ChatAddress("discord", "ann"), "late one", metadata={OFFLINE_SENT_AT: 1_700_000_000_000}
    )
    live = queue.intake.enqueue_message(ChatAddress("discord", "ann"), "live one", metadata={"guild_id": ""})
    assert late_messages.offline_sent_at(queue.db, late.message_id) == 1_700_000_000_000
    assert late_messages.offline_sent_at(queue.db, live.message_id) is None
    assert late_messages.offline_sent_at(queue.db, "discord_zzzzzzzz") is None
