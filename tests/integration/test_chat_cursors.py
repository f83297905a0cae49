"""Catch-up cursors (the newest platform message id taken in, per chat) only move forward, also when two
messages are recorded out of order. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from shared.chat import cursors
from shared.chat.address import ChatAddress
from shared.queue.core import Queue

pytestmark = pytest.mark.integration


def test_a_cursor_only_moves_forward_and_keeps_its_note(queue: Queue) -> None:
    db = queue.db
    cursors.note_seen(db, ChatAddress("discord", conversation="700"), 1_000_000_000_000_000_005, "guild-1")
    cursors.note_seen(
        db, ChatAddress("discord", conversation="700"), 1_000_000_000_000_000_003, "guild-1"
    )  # handled later
    cursors.note_seen(db, ChatAddress("discord", conversation="701"), 9, "")
    cursors.note_seen(db, ChatAddress("telegram", conversation="700"), 10**19, "")
    found = {c.conversation: (c.last_id, c.note) for c in cursors.cursors(db, "discord")}
    assert found == {"700": (1_000_000_000_000_000_005, "guild-1"), "701": (9, "")}
    # A larger id with more digits still compares as larger (the ids are zero-padded).
    cursors.note_seen(db, ChatAddress("discord", conversation="701"), 10**18)
    assert [c.last_id for c in cursors.cursors(db, "discord") if c.conversation == "701"] == [10**18]
    with pytest.raises(ValueError):
        cursors.note_seen(db, ChatAddress("discord", conversation="701"), 10**21)
