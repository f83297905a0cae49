"""workers.run.Run on its own: one claimed group through one real CLI run (the scripted ``command`` agent)
over a real SQLite queue, built with what the processor would pass it — a success completes the group with
the reply, a failing CLI sends it back with an attempt counted, an agent no longer configured never starts: it is dead at once, with no attempt at a run.
"""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.processor_support import (
    agent_script,
    command_agent,
    event_types,
    make_home,
    open_home,
    read_invocations,
)
from workers.busy import WorkGroup
from workers.drive import Drive
from workers.pauses import RateLimitPauses
from workers.processor_config import ProcessorSettings, ProcessorStats
from workers.run import Run
from workers.run_outcome import OutcomeWriter
from workers.sandbox import SandboxChoice
from workers.storage_steps import StorageSteps

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WORKER = "here:1:1"


def run_group(rt: Runtime, agent: str, log: Path) -> tuple[Drive, ProcessorStats]:
    """Claim ``agent``'s pending messages as one group and take it through a :class:`Run`."""
    drive = Drive(agent)
    group = WorkGroup(rt.queue.messages.claim_all_pending_messages(agent, WORKER, lease_ms=30_000), "collect")
    drive.running = group
    config = rt.settings.section("processor", ProcessorSettings)
    stats = ProcessorStats()
    storage = StorageSteps(
        rt,
        WORKER,
        config=lambda: config,
        stopping=lambda: False,
        held=lambda: {agent: drive.held_ids()},
        on_outage_end=lambda: None,
    )
    outcomes = OutcomeWriter(
        rt, drive, worker=WORKER, config=config, stats=stats, pauses=RateLimitPauses(), storage=storage
    )
    sandbox = SandboxChoice()
    run = Run(
        rt,
        drive,
        group,
        outcomes=outcomes,
        storage=storage,
        worker=WORKER,
        config=config,
        env={"PATH": os.environ.get("PATH", ""), "AGENT_LOG": str(log)},
        sandbox=lambda: sandbox.plan(config.sandbox),
        stats=stats,
    )
    anyio.run(run.go)
    return drive, stats


def test_a_run_completes_its_group_with_the_agents_reply(tmp_path: Path, sqlite_url: str) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    home = make_home(tmp_path, sqlite_url, {"solo": command_agent(script)})
    with open_home(home) as rt:
        first = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="a"), "alpha"
        )
        second = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="a"), "beta"
        )
        drive, stats = run_group(rt, "solo", log)

        (invocation,) = read_invocations(log)
        assert "alpha" in invocation.prompt and "beta" in invocation.prompt  # one run for the chat's group
        for mid in (first.message_id, second.message_id):
            assert rt.queue.admin.get_message(mid).status == "completed"  # type: ignore[union-attr]
        (reply,) = rt.queue.admin.list_responses()
        assert reply.message.startswith("(Answering your 2 messages together.)")
        assert reply.metadata["kind"] == "final" and reply.metadata["edit_key"].startswith("run")
        assert stats.invocations == 1 and stats.completed == 2 and drive.held_ids() == []
        types = event_types(rt, first.message_id)
        assert types.index("chain_step_start") < types.index("chain_step_done")


def test_a_failing_cli_sends_the_group_back_with_an_attempt_counted(tmp_path: Path, sqlite_url: str) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    home = make_home(tmp_path, sqlite_url, {"solo": command_agent(script)})
    with open_home(home) as rt:
        mid = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="7", conversation="a"), "please fail"
        ).message_id
        drive, stats = run_group(rt, "solo", log)

        message = rt.queue.admin.get_message(mid)
        assert message is not None and message.status == "pending" and message.retry_count == 1
        assert "something broke" in (message.last_error or "")
        assert stats.invocations == 1 and stats.failed == 1 and drive.held_ids() == []
        assert len(read_invocations(log)) == 1


def test_a_group_of_an_agent_no_longer_configured_never_starts(tmp_path: Path, sqlite_url: str) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    home = make_home(tmp_path, sqlite_url, {"solo": command_agent(script), "gone": command_agent(script)})
    with open_home(home) as rt:
        mid = rt.queue.intake.enqueue_message(
            ChatAddress("api", "u", conversation="c"), "hello", agent="gone"
        ).message_id
        make_home(tmp_path, sqlite_url, {"solo": command_agent(script)})  # "gone" is taken out of the file
        assert rt.refresh_settings(force=True) and "gone" not in rt.settings.agents
        _, stats = run_group(rt, "gone", log)

        message = rt.queue.admin.get_message(mid)
        assert message is not None and message.status == "dead"
        assert "'gone' is not configured" in (message.last_error or "")
        assert stats.invocations == 0 and read_invocations(log) == []
        assert "chain_step_start" not in event_types(rt, mid)
