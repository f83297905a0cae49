"""The steer claim (``Messages.claim_chat_into_run``) takes only the running chat's own messages for the
running agent: a message of another chat — another conversation on the same channel, the same conversation
name on another channel — or of the same chat for another agent stays pending for its own run. Handing it to
this chat's run would show one person's message to another's conversation (issue 39, item 6: dropping the
chat condition passed every test; checked: dropping the channel, the conversation or the agent condition
fails this test)."""

from __future__ import annotations

import pytest

from shared.chat.address import ChatAddress
from shared.queue.core import Directory, Queue
from shared.settings.model import QueueSettings
from shared.storage.db import Database

pytestmark = pytest.mark.integration

WORKER = "otherhost:1:1"
RUNNING = ChatAddress("telegram", "ann", sender_id="7", conversation="c1")


@pytest.fixture
def queue(db: Database) -> Queue:
    directory = Directory(agents=frozenset({"alpha", "beta"}), teams={}, default_agent="alpha")
    return Queue(db, QueueSettings(backoff_base_seconds=1, backoff_max_seconds=60), directory)


def test_a_steer_claim_takes_only_the_running_chats_messages_for_its_agent(queue: Queue) -> None:
    first = queue.intake.enqueue_message(RUNNING, "first", agent="alpha").message_id
    (claimed,) = queue.messages.claim_all_pending_messages("alpha", WORKER)
    assert claimed.message_id == first
    queue.messages.mark_run_started([first], WORKER)
    # Arrivals while the run goes on: one of the running chat, and three that are not its own.
    others = {
        "another conversation": ChatAddress("telegram", "bob", sender_id="8", conversation="c2"),
        "another channel": ChatAddress("discord", "cy", sender_id="9", conversation="c1"),
    }
    waiting = {
        why: queue.intake.enqueue_message(chat, why, agent="alpha").message_id for why, chat in others.items()
    }
    waiting["another agent"] = queue.intake.enqueue_message(RUNNING, "for beta", agent="beta").message_id
    own = queue.intake.enqueue_message(RUNNING, "second", agent="alpha").message_id

    steered = queue.messages.claim_chat_into_run("alpha", WORKER, RUNNING, "run_abcdefgh")

    assert [m.message_id for m in steered] == [own]
    assert all(m.address.key == RUNNING.key for m in steered)
    for why, message_id in waiting.items():
        row = queue.db.read(
            "SELECT status, claimed_by FROM messages WHERE message_id = :m", {"m": message_id}
        )
        assert (row[0]["status"], row[0]["claimed_by"]) == ("pending", None), why
    # Nothing more of the chat waits: a second steer claim takes nothing, and the others still wait.
    assert queue.messages.claim_chat_into_run("alpha", WORKER, RUNNING, "run_abcdefgh") == []
