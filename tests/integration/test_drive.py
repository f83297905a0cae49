"""workers.drive.Drive.keep_leases over a real SQLite queue: the leases of what a drive holds outlive their
length while it renews them, and once another worker has taken a message over the drive counts itself lost
and cancels what it runs.
"""

from __future__ import annotations

import functools
from pathlib import Path

import anyio
import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.processor_support import agent_script, command_agent, make_home, open_home, wait_for
from workers.busy import WorkGroup
from workers.drive import Drive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

WORKER = "elsewhere:1:1"  # another host's id: recovery may take its claims back once their leases lapse
LEASE_MS = 600


def renew(rt: Runtime, agent: str, ids: list[str]) -> int:
    return rt.queue.leases.renew_leases(WORKER, ids, agent=agent, lease_ms=LEASE_MS)


def test_renewed_leases_outlive_their_length_and_a_takeover_marks_the_drive_lost(
    tmp_path: Path, sqlite_url: str
) -> None:
    home = make_home(tmp_path, sqlite_url, {"solo": command_agent(agent_script(tmp_path))})
    with open_home(home) as rt:
        mid = rt.queue.intake.enqueue_message(ChatAddress("api", "u", conversation="c"), "hello").message_id
        drive = Drive("solo")
        drive.running = WorkGroup(
            rt.queue.messages.claim_all_pending_messages("solo", WORKER, lease_ms=LEASE_MS), "collect"
        )
        assert drive.held_ids() == [mid]
        keep = functools.partial(renew, rt, "solo")

        async def renewing_for(seconds: float) -> bool:
            """Renew for ``seconds`` (three lease lengths); True when the drive cancelled its scope itself."""
            with anyio.move_on_after(seconds) as timer:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(drive.keep_leases, keep, LEASE_MS / 3000, tg.cancel_scope)
            return not timer.cancelled_caught

        assert anyio.run(renewing_for, 3 * LEASE_MS / 1000) is False
        assert rt.queue.failures.recover_stale_messages().retried == []  # still leased: nothing to take back
        assert not drive.lost

        # Without renewal the lease lapses and recovery takes the message back; the next renewal finds it gone.
        wait_for(
            lambda: rt.queue.failures.recover_stale_messages().retried == [mid],
            10,
            "the lapsed lease taken back",
        )
        assert anyio.run(renewing_for, 10.0) is True
        assert drive.lost
