"""adapters.platform.Inbound: its chat address, and the record kept while its sender waits for pairing."""

from __future__ import annotations

import pytest

from adapters.platform import Inbound
from shared.chat.address import ChatAddress

pytestmark = pytest.mark.unit


def test_an_inbound_message_is_addressed_by_its_chat() -> None:
    message = Inbound("-100:7", "42", "ann", "hi", "-100:99")
    assert message.address_on("telegram") == ChatAddress("telegram", "ann", "42", "-100:7")
    assert message.address_on("telegram").label == "telegram:-100:7"


def test_a_held_message_reads_back_as_it_was_written() -> None:
    message = Inbound("c1", "42", "ann", "hi", "x1", metadata={"k": 1}, sent_at=1_700_000_000_000)
    assert Inbound.from_held("42", message.held_record()) == message


def test_a_held_message_without_a_time_is_stamped_when_kept() -> None:
    record = Inbound("c1", "42", "ann", "hi", "x1").held_record()
    assert record["sent_at"] > 0 and set(record) == {
        "conversation",
        "sender_id",
        "sender",
        "text",
        "external_id",
        "metadata",
        "sent_at",
    }
