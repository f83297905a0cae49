"""Whether any processor runs (shared.queue.reports.processor_running), as `agentpost send --wait` asks it:
from the presence rows processors keep while they run, their start and stop events and the agent leases, with
the holders' processes looked up."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import SqlEventLog
from shared.queue import presence
from shared.queue.core import Queue
from shared.queue.reports import processor_running
from shared.worker_identity import new_worker_id

pytestmark = pytest.mark.integration


def _gone_worker() -> str:
    """The worker id of a process that has ended (this host, its real start time)."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    worker = new_worker_id(proc.pid)
    proc.communicate(b"", timeout=30)
    return worker


def test_started_processors_count_until_they_stop_or_their_process_is_gone(queue: Queue) -> None:
    events = SqlEventLog(queue.db)
    assert not processor_running(queue.db)  # nothing ever started

    events.append("processor", "processor_start", {"worker": _gone_worker()})
    assert not processor_running(queue.db)  # killed: its start is left, its process is not

    here = new_worker_id()
    events.append("processor", "processor_start", {"worker": here})
    assert processor_running(queue.db)
    events.append("processor", "processor_stop", {"worker": here})
    assert not processor_running(queue.db)

    # Only its own host can tell whether a processor elsewhere still runs: it counts as running.
    events.append("processor", "processor_start", {"worker": "another-host:4242:777"})
    assert processor_running(queue.db)
    events.append("processor", "processor_stop", {"worker": "another-host:4242:777"})
    assert not processor_running(queue.db)


def test_a_processor_holding_an_agent_counts_without_its_start_event(queue: Queue) -> None:
    # A processor up longer than the event log keeps its start is still seen while it works an agent.
    queue.intake.enqueue_message(ChatAddress("cli", "ann"), "hi", agent="alpha")
    assert queue.messages.claim_all_pending_messages("alpha", _gone_worker())
    assert not processor_running(queue.db)  # the holder's process is gone

    queue.intake.enqueue_message(ChatAddress("cli", "ann"), "hi", agent="beta")
    assert queue.messages.claim_all_pending_messages("beta", new_worker_id())
    assert processor_running(queue.db)


def test_a_presence_row_counts_while_its_processor_runs_and_not_after(queue: Queue) -> None:
    # No start event at all (the log dropped it after events.ttl_hours): the row alone says it runs.
    here = new_worker_id()
    presence.announce(queue.db, here, 4242, ["alpha"])
    assert processor_running(queue.db)
    presence.withdraw(queue.db, here)
    assert not processor_running(queue.db)

    presence.announce(queue.db, _gone_worker(), 4243, ["alpha"])  # killed: its row is left behind
    assert not processor_running(queue.db)

    # Another host's processor counts while it refreshes its row, and not once it stopped refreshing.
    elsewhere = "another-host:4244:777"
    presence.announce(queue.db, elsewhere, 4244, ["alpha"])
    assert processor_running(queue.db)
    assert not processor_running(queue.db, now_ms() + presence.STALE_MS + 1)
