"""A claimed message as the queue hands it to the processor, for unit tests of what is built from one."""

from __future__ import annotations

from shared.queue.core import QueuedMessage


def claimed_message(
    n: int = 1,
    *,
    conversation: str = "c",
    text: str = "",
    sender: str = "ann",
    sender_id: str = "7",
    last_error: str | None = None,
) -> QueuedMessage:
    """Message ``m_<n>`` of a Telegram chat, claimed by worker ``w`` for agent ``coder`` (text ``msg <n>``
    unless given)."""
    return QueuedMessage(
        id=n, message_id=f"m_{n:08d}", channel="telegram", sender=sender, sender_id=sender_id,
        message=text or f"msg {n}", agent="coder", from_agent=None, status="processing", retry_count=0,
        manual_retries=0, last_error=last_error, created_at=0, updated_at=0, conversation=conversation,
        metadata={}, available_at=0, claimed_by="w", lease_until=0, hops=0, external_id=None,
    )  # fmt: skip
