"""The run budget of one user message: a team whose members all hand work to each other stops at the budget,
and the user is told once."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from tests.processor_support import count, make_home, open_home, run_idle

pytestmark = pytest.mark.integration

# Every run hands the work on to both teammates: without a budget one message fans out until max_hops.
HAND_ON = """
import os
me = os.environ["AGENTPOST_AGENT"]
others = [a for a in ("ann", "bob", "cat") if a != me]
print(f"{me} did a bit. " + " ".join(f"[@{o}: your turn]" for o in others))
"""


@pytest.mark.parametrize("budget", [4, 10])
def test_a_team_handing_work_around_stops_at_the_run_budget_with_one_notice(
    tmp_path: Path, sqlite_url: str, budget: int
) -> None:
    script = tmp_path / "hand_on.py"
    script.write_text(HAND_ON)
    agent = {"provider": "command", "command": [sys.executable, str(script)]}
    home = make_home(
        tmp_path,
        sqlite_url,
        {"ann": agent, "bob": agent, "cat": agent},
        teams={"crew": {"agents": ["ann", "bob", "cat"], "leader": "ann"}},
        queue={"max_chain_runs": budget, "max_hops": 8},
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "zoe", sender_id="9", conversation="c9"), "@crew build it"
        )
        run_idle(rt, timeout=60)
        runs = count(rt, "SELECT COUNT(*) FROM events WHERE type = 'chain_step_start'")
        notices = rt.db.read("SELECT * FROM responses WHERE metadata LIKE '%budget_notice%'")
        to_user = count(
            rt, "SELECT COUNT(*) FROM responses WHERE channel = 'telegram' AND conversation = 'c9'"
        )
        left = count(rt, "SELECT COUNT(*) FROM messages WHERE status NOT IN ('completed')")
        handoffs = count(rt, "SELECT COUNT(*) FROM messages WHERE channel <> 'telegram'")
    # The budget is spent per queued handoff (two handoffs waiting for one agent may share a run), so the
    # runs never exceed it: the user's own message plus budget - 1 handoffs.
    assert handoffs == budget - 1
    assert budget * 0.6 <= runs <= budget
    assert (
        len(notices) == 1
        and f"{budget} runs" in notices[0]["message"]
        and sent.message_id in notices[0]["message"]
        and re.search(
            "the work “(ann|bob|cat)” handed to “(ann|bob|cat)” was not passed on", notices[0]["message"]
        )
    )
    assert notices[0]["conversation"] == "c9" and notices[0]["sender_id"] == "9"
    assert to_user == runs + 1  # one reply per run, plus the one notice
    assert left == 0
