"""A failed run's cost counts: its tokens and cost are recorded with its outcome (a retry or a dead letter),
so ``[budgets]`` see what failing runs spent (issue 39, item 6: dropping the usage from a failed run's
outcome passed every test).

The agent is a scripted stand-in for the claude CLI that prints the stream-json lines a run that spent
tokens and then failed prints (a ``result`` with ``is_error``, its ``usage`` and ``total_cost_usd``) and
exits 1; the processor parses it as it parses the real CLI.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.reads.budget_status import check_over
from shared.settings.sections import BudgetSettings
from tests.homes import open_home
from tests.processor_support import make_home, run_idle

pytestmark = [pytest.mark.integration]


def _failing_claude(tmp: Path, error: str) -> Path:
    """The stand-in: the run's init line, then a failed result (``error``) that still cost something."""
    lines = [
        {"type": "system", "subtype": "init", "session_id": "sess-1", "model": "claude-test"},
        {
            "type": "result",
            "subtype": "error_during_execution",
            "is_error": True,
            "result": error,
            "session_id": "sess-1",
            "usage": {"input_tokens": 1200, "output_tokens": 300},
            "total_cost_usd": 0.75,
        },
    ]
    script = tmp / "failing_claude.py"
    printed = "".join(json.dumps(line) + "\n" for line in lines)
    script.write_text(
        f"import sys\nsys.stdout.write({printed!r})\nsys.stdout.flush()\nsys.exit(1)\n", encoding="utf-8"
    )
    return script


@pytest.mark.parametrize("permanent", [False, True], ids=["retried", "dead"])
def test_a_failed_runs_tokens_and_cost_are_recorded_and_count_to_budgets(
    tmp_path: Path, db_url: str, permanent: bool
) -> None:
    # A transient error is retried (the message is back, pending); "was not found" is permanent (dead).
    error = "model claude-x was not found" if permanent else "the model stopped halfway: connection reset"
    command = [sys.executable, str(_failing_claude(tmp_path, error))]
    agent = {"provider": "claude", "timeout_seconds": 30, "command": command}
    home = make_home(
        tmp_path, db_url, {"coder": agent}, queue={"backoff_base_seconds": 60, "backoff_max_seconds": 60}
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), "do the thing"
        )
        run_idle(rt)
        status = rt.db.read_scalar(
            "SELECT status FROM messages WHERE message_id = :m", {"m": sent.message_id}
        )
        rows = [dict(r) for r in rt.db.read("SELECT * FROM run_usage")]
        budgets = BudgetSettings.model_validate({"sender_daily_usd": 0.5})
        over = check_over(rt.db, "sender", "telegram:42", "coder", budgets, now_ms())
    assert status == ("dead" if permanent else "pending"), status
    assert len(rows) == 1, rows
    (row,) = rows
    assert row["message_id"] == sent.message_id and row["agent"] == "coder"
    assert not row["ok"]
    assert (row["input_tokens"], row["output_tokens"]) == (1200, 300)
    assert row["cost_usd"] == pytest.approx(0.75)
    assert row["sender"] == "telegram:42"
    # What the failed run spent counts against the sender's daily budget.
    assert over is not None
