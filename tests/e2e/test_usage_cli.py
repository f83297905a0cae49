"""``agentpost usage`` as an operator runs it (a table by default, plain-words refusals of bad options), and
budgets as the operator sees them in ``agentpost doctor`` (who is over a limit now) and ``agentpost trace``
(a message not run because of one, with the figures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.reads.usage import UsageRecord, record_usage_in
from tests.homes import open_home
from tests.processor_support import run_idle
from tests.web_support import make_home

pytestmark = pytest.mark.e2e

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def run(home: Path, *args: str, command: str = "usage") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), COLUMNS="200", NO_COLOR="1")
    return subprocess.run([AGENTPOST, command, *args], env=env, capture_output=True, text=True, timeout=60)


def test_usage_prints_a_table_and_refuses_bad_options_in_plain_words(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    empty = run(home)
    assert empty.returncode == 0, empty.stderr
    assert "no runs with recorded usage in the last 7d" in empty.stdout
    assert "no runs with recorded usage yet" in run(home, "--since", "all").stdout
    rt = open_home(home)
    try:
        with rt.db.transaction() as tx:
            for day in (0, 1):
                at = now_ms() - day * 86_400_000
                record = UsageRecord(agent="alpha", sender="telegram:42", input_tokens=100, cost_usd=0.5)
                record_usage_in(tx, record, at=at)
    finally:
        rt.close()
    table = run(home, "--by", "sender")
    assert table.returncode == 0, table.stderr
    (row,) = [line for line in table.stdout.splitlines() if "telegram:42" in line]
    assert row.split()[1:3] == ["2", "200"] and row.split()[-1] == "1.0000", row
    by_day = run(home, "--by", "day", "--since", "2d")
    assert by_day.stdout.count(" 0.5000") == 2, by_day.stdout
    for args, words in ((["--by", "planet"], "cannot group by 'planet'"), (["--since", "soon"], "7d")):
        refused = run(home, *args)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


BUDGETS = """
[budgets]
sender_daily_usd = 0.05
agent_monthly_usd = 10

[budgets.agents.beta]
agent_daily_usd = 0.5
"""


def _budget_findings(home: Path) -> dict[str, dict[str, str]]:
    proc = run(home, "--json", command="doctor")
    return {c["name"]: c for c in json.loads(proc.stdout) if c["area"] == "budgets"}


def test_doctor_and_trace_tell_the_operator_who_is_over_budget(tmp_path: Path) -> None:
    home = make_home(tmp_path, extra=BUDGETS)
    rt = open_home(home)
    try:
        clean = _budget_findings(home)
        assert clean == {"spending": clean["spending"]} and clean["spending"]["level"] == "ok", clean
        assert clean["spending"]["detail"] == "no one over budget"
        with rt.db.transaction() as tx:
            record_usage_in(tx, UsageRecord(agent="alpha", sender="telegram:42", cost_usd=0.0612))
            record_usage_in(tx, UsageRecord(agent="alpha", sender="telegram:43", cost_usd=0.01))
            record_usage_in(tx, UsageRecord(agent="beta", cost_usd=0.75))  # a heartbeat's run
        held = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42"), "one more", agent="alpha"
        )
        run_idle(rt)
        message = rt.queue.admin.get_message(held.message_id)
        assert message is not None and message.status == "dead"
    finally:
        rt.close()

    found = _budget_findings(home)
    assert sorted(found) == ["agent beta", "sender telegram:42"], found  # not telegram:43, under the limit
    ann = found["sender telegram:42"]
    assert ann["level"] == "warn"
    assert "$0.0612 of the daily limit $0.0500, resets at midnight UTC" in ann["detail"], ann
    assert "budgets.sender_daily_usd" in ann["fix"] and "exempt_senders" in ann["fix"]
    beta = found["agent beta"]
    assert "$0.7500 of the daily limit $0.5000" in beta["detail"], beta
    assert "budgets.agents.beta.agent_daily_usd" in beta["fix"], beta  # its own override set that limit
    text = run(home, command="doctor").stdout
    assert "budgets: sender telegram:42 — over budget" in text, text

    story = run(home, held.message_id, command="trace")
    assert story.returncode == 0, story.stderr
    verdict = story.stdout.strip().splitlines()[-1]
    assert verdict.startswith(
        "=> not run because its sender telegram:42 spent $0.0612 of the daily limit $0.0500 "
        "(budgets.sender_daily_usd); resets at midnight UTC"
    ), verdict
    assert "the sender was told" in verdict and f"agentpost dead retry {held.message_id}" in verdict
