"""The queue's records: claimed messages grouped by chat, oldest first."""

from __future__ import annotations

import pytest

from shared.queue_types import group_by_conversation

pytestmark = pytest.mark.unit


def test_group_by_conversation_keeps_primary_first() -> None:
    from shared.queue import QueuedMessage

    def msg(i: int, conv: str) -> QueuedMessage:
        return QueuedMessage(
            i,
            f"cli_{i:08d}",
            "cli",
            "s",
            "",
            "t",
            "a",
            None,
            "processing",
            0,
            0,
            None,
            0,
            0,
            conv,
            {},
            0,
            None,
            None,
            0,
            None,
        )

    groups = group_by_conversation([msg(3, "b"), msg(1, "a"), msg(2, "b"), msg(4, "a")])
    assert [[m.id for m in g] for g in groups] == [[1, 4], [2, 3]]
