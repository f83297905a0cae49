"""The run budget of one user message: a team whose members all hand work to each other stops at the budget,
and the user is told once."""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shared.chain_budget import first_hops_refusal, take_chain_run
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.storage.db import Tx
from shared.storage.schema import open_database
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


# -- two teammates finishing at once (PostgreSQL: transactions run side by side) -----------------------------
def _side_by_side(db_url: str, step: Callable[[Tx], bool]) -> list[bool]:
    """``step`` in two transactions on two connections: the first holds its transaction open until the
    second is seen waiting for a lock or has finished (it then read without waiting: the race), then both
    commit. Their results, first's first."""
    first_db, second_db = open_database(db_url), open_database(db_url)
    results: dict[str, bool] = {}
    second_done = threading.Event()

    def second() -> None:
        with second_db.transaction() as tx:
            results["second"] = step(tx)
        second_done.set()

    def waiting_for_a_lock() -> bool:
        return bool(
            first_db.read_scalar(
                "SELECT COUNT(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = current_database()"
            )
        )

    try:
        with first_db.transaction() as tx:
            results["first"] = step(tx)
            thread = threading.Thread(target=second)
            thread.start()
            deadline = time.monotonic() + 60  # a loaded machine may take a while to run the second thread
            while not (second_done.is_set() or waiting_for_a_lock()):
                assert time.monotonic() < deadline, "the second transaction neither waited nor finished"
                time.sleep(0.01)
        thread.join(60)
        assert not thread.is_alive()
        return [results["first"], results["second"]]
    finally:
        first_db.close()
        second_db.close()


@pytest.mark.postgres
def test_two_teammates_past_the_hop_limit_at_once_tell_the_user_once(pg_url: str) -> None:
    told = _side_by_side(pg_url, lambda tx: first_hops_refusal(tx, "root-1", now_ms()))
    assert told == [True, False]


@pytest.mark.postgres
def test_two_teammates_at_once_cannot_both_spend_the_last_run(pg_url: str) -> None:
    # A budget of 2: the user message's own run is the first, so one more run is left.
    granted = _side_by_side(pg_url, lambda tx: take_chain_run(tx, "root-2", 2, now_ms())[0])
    assert granted == [True, False]
