"""The chat address: the one rule for which chat a message belongs to and where its reply goes."""

from __future__ import annotations

import pytest

from shared.chat.address import ChatAddress

pytestmark = pytest.mark.unit


def test_the_chat_is_the_conversation_else_the_sender_id_else_the_sender() -> None:
    assert ChatAddress("telegram", "ann", "42", "-100").chat == "-100"
    assert ChatAddress("whatsapp", "ann", "4915", "").chat == "4915"
    assert ChatAddress("cli", "ann", "", "").chat == "ann"


def test_messages_of_one_chat_share_a_key_whoever_sent_them() -> None:
    a = ChatAddress("discord", "ann", "1", "room")
    b = ChatAddress("discord", "bob", "2", "room")
    assert a.key == b.key == ("discord", "room")
    assert ChatAddress("telegram", "ann", "1", "room").key != a.key
    assert a.label == "discord:room"


def test_an_address_read_from_a_row_survives_missing_and_null_fields() -> None:
    address = ChatAddress.of({"channel": "web", "sender": None, "conversation": "c1", "extra": 1})
    assert address == ChatAddress("web", "", "", "c1")
    assert ChatAddress.of(address.fields()) == address


def test_a_forum_topic_is_the_part_after_the_colon() -> None:
    assert ChatAddress("telegram", conversation="-100:7").thread == "7"
    assert ChatAddress("telegram", conversation="-100").thread == ""


def test_the_address_cannot_change_once_made() -> None:
    address = ChatAddress("web", "ann")
    with pytest.raises(AttributeError):
        address.channel = "cli"  # type: ignore[misc]
