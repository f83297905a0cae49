"""The queue audit (scheduler.audit): it measures the profile of the queue and judges it."""

from __future__ import annotations

import pytest

from scheduler.audit import run_audit
from shared.chat.address import ChatAddress
from shared.queue.core import ResponseDraft
from shared.runtime import Runtime

pytestmark = pytest.mark.integration


def test_audit_measures_the_profile_and_judges_it(scheduler_rt: Runtime) -> None:
    q = scheduler_rt.queue
    for i in range(6):
        q.intake.enqueue_message(ChatAddress("cli", "ann"), f"m{i}")
    claimed = q.messages.claim_all_pending_messages("assistant", "w")
    for m in claimed[:4]:
        q.messages.complete_messages([m.message_id], "w", ResponseDraft(message="ok"))
    q.failures.fail_messages([m.message_id for m in claimed[4:]], "w", "boom")
    audit = run_audit(q, hours=1, capacity_per_second=1000)
    assert (audit.received, audit.completed, audit.dead) == (6, 4, 2)
    assert audit.peak_per_second >= 1 and audit.hours and audit.hours[-1].received == 6
    assert audit.depth["dead"] == 2
    if audit.database == "sqlite":
        assert audit.verdict.startswith("Within capacity") and not audit.move_to_postgresql
        tight = run_audit(q, hours=1, capacity_per_second=0.01)
        assert tight.verdict.startswith("Beyond capacity") and tight.move_to_postgresql
    else:
        assert "already runs on postgresql" in audit.verdict
