"""workers.run_outcome.OutcomeWriter on its own, over a real SQLite queue: the outcomes written without a run
(a chat stopped while it waited, the ``max_waiting`` cap), and the fence that keeps a worker from writing an
outcome for messages another worker holds now.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.processor_support import agent_script, command_agent, event_types, make_home, open_home
from workers.busy import WorkGroup
from workers.drive import Drive
from workers.pauses import RateLimitPauses
from workers.processor_config import ProcessorSettings, ProcessorStats
from workers.run_outcome import STOPPED_TEXT, OutcomeWriter
from workers.storage_steps import StorageSteps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def writer(rt: Runtime, drive: Drive, worker: str, stats: ProcessorStats) -> OutcomeWriter:
    """An outcome writer with what a processor would give it (its own storage steps and pauses)."""
    config = rt.settings.section("processor", ProcessorSettings)
    storage = StorageSteps(
        rt,
        worker,
        config=lambda: config,
        stopping=lambda: False,
        held=lambda: {drive.agent: drive.held_ids()},
        on_outage_end=lambda: None,
    )
    return OutcomeWriter(
        rt, drive, worker=worker, config=config, stats=stats, pauses=RateLimitPauses(), storage=storage
    )


def claimed_groups(rt: Runtime, agent: str, worker: str) -> Drive:
    """A drive holding every pending message of ``agent`` as one waiting group per chat, claimed by ``worker``."""
    drive = Drive(agent)
    claimed = rt.queue.messages.claim_all_pending_messages(agent, worker, lease_ms=30_000)
    for key in dict.fromkeys(m.conversation_key for m in claimed):
        drive.groups.append(WorkGroup([m for m in claimed if m.conversation_key == key], "collect"))
    return drive


def test_a_waiting_chat_that_is_stopped_completes_with_one_stopped_reply(
    tmp_path: Path, sqlite_url: str
) -> None:
    home = make_home(tmp_path, sqlite_url, {"solo": command_agent(agent_script(tmp_path))})
    with open_home(home) as rt:
        stopped = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="a"), "first"
        )
        kept = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "bob", sender_id="8", conversation="b"), "second"
        )
        drive = claimed_groups(rt, "solo", "here:1:1")
        stats = ProcessorStats()
        group = next(g for g in drive.groups if g.ids == [stopped.message_id])
        anyio.run(writer(rt, drive, "here:1:1", stats).stopped, group, None)

        assert rt.queue.admin.get_message(stopped.message_id).status == "completed"  # type: ignore[union-attr]
        assert rt.queue.admin.get_message(kept.message_id).status == "processing"  # type: ignore[union-attr]
        replies = rt.queue.admin.list_responses()
        assert [r.message for r in replies] == [STOPPED_TEXT]
        assert replies[0].metadata["kind"] == "stopped" and "edit_key" not in replies[0].metadata
        assert (replies[0].channel, replies[0].conversation) == ("telegram", "a")
        assert stats.stopped == 1 and drive.held_ids() == [kept.message_id]
        assert "run_stopped" in event_types(rt, stopped.message_id)


def test_messages_dropped_by_the_cap_complete_with_one_notice_naming_them(
    tmp_path: Path, sqlite_url: str
) -> None:
    home = make_home(
        tmp_path, sqlite_url, {"solo": command_agent(agent_script(tmp_path))}, processor={"max_waiting": 1}
    )
    with open_home(home) as rt:
        ids = [
            rt.queue.intake.enqueue_message(
                ChatAddress("telegram", "ann", sender_id="7", conversation="a"), f"note {n}"
            ).message_id
            for n in range(3)
        ]
        drive = claimed_groups(rt, "solo", "here:1:1")
        stats = ProcessorStats()
        batch = drive.groups[0].messages[:2]
        anyio.run(writer(rt, drive, "here:1:1", stats).dropped, batch)

        assert [rt.queue.admin.get_message(i).status for i in ids] == ["completed", "completed", "processing"]  # type: ignore[union-attr]
        (notice,) = rt.queue.admin.list_responses()
        assert notice.metadata["kind"] == "dropped" and notice.metadata["dropped"] == ids[:2]
        assert "the limit is 1" in notice.message and "“note 0”" in notice.message
        assert stats.dropped == 2 and "messages_dropped" in event_types(rt, ids[0])


def test_an_outcome_for_messages_another_worker_holds_is_fenced_off(tmp_path: Path, sqlite_url: str) -> None:
    home = make_home(tmp_path, sqlite_url, {"solo": command_agent(agent_script(tmp_path))})
    with open_home(home) as rt:
        mid = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="a"), "hello"
        ).message_id
        drive = claimed_groups(rt, "solo", "there:2:2")  # the messages are another worker's
        stats = ProcessorStats()
        group = drive.groups[0]
        outcomes = writer(rt, drive, "here:1:1", stats)
        settled = anyio.run(
            outcomes.settle, group, rt.queue.messages.complete_messages, group.ids, "here:1:1", None
        )

        assert settled is False
        message = rt.queue.admin.get_message(mid)
        assert message is not None and message.status == "processing" and message.claimed_by == "there:2:2"
        assert rt.queue.admin.list_responses() == []
        assert stats.lease_lost == 1 and drive.held_ids() == []  # not ours: no longer held here
        assert "lease_lost" in event_types(rt, mid)
