"""The queue's records: claimed messages grouped by chat, oldest first."""

from __future__ import annotations

import pytest

from shared.queue.records import group_by_conversation

pytestmark = pytest.mark.unit


def test_group_by_conversation_keeps_primary_first() -> None:
    from shared.queue.core import QueuedMessage

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


def test_message_from_a_whole_row_equals_the_constructed_one() -> None:
    from dataclasses import fields

    from shared.queue.core import QueuedMessage

    names = [f.name for f in fields(QueuedMessage)]
    row = {name: i for i, name in enumerate(names)}
    row.update(message_id="cli_00000001", metadata='{"origin": {"channel": "cli"}}', external_id=None)
    whole = QueuedMessage.from_row(row)
    built = QueuedMessage(**{**row, "metadata": {"origin": {"channel": "cli"}}})
    assert whole == built and whole.metadata == {"origin": {"channel": "cli"}}
    assert whole.address == built.address and whole.as_dict() == built.as_dict()
    # A row without the newer columns (their defaults apply) takes the constructor's path.
    partial = {k: v for k, v in row.items() if k not in ("run_started_at", "interruptions")}
    assert QueuedMessage.from_row(partial) == QueuedMessage(
        **{**partial, "metadata": {"origin": {"channel": "cli"}}}
    )
    with pytest.raises(TypeError):
        QueuedMessage.from_row({**row, "unknown_column": 1})
