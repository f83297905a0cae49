"""What runs cost, with the real Claude Code CLI against the fake Messages API: every run's tokens and cost
are recorded with its outcome and read back by ``agentpost usage`` (a real subprocess on the same home).

The expected figures are the CLI's own: the agent's command is a small wrapper that runs the real CLI and
keeps a copy of its stream-json output, so the test sums the ``result`` lines the processor read.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapters.telegram import TelegramChannel
from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.reads.usage import UsageRecord, next_day_start, record_usage_in
from shared.runtime import Runtime
from shared.settings.model import load_settings
from tests.channel_support import HoldingTelegram, RunningChannel, channel_home
from tests.fakes.anthropic_api import FakeAnthropic, Text
from tests.fixtures import anthropic_api, cli_installed, telegram_fake  # noqa: F401  (fixtures)
from tests.homes import open_home
from tests.probes import wait_for
from tests.processor_support import make_home, run_idle
from tests.usage_support import claude_tee, cli_env, own_cost, reported
from tests.web_support import LiveServer, runtime_for
from tests.web_support import make_home as web_home

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def _usage_cli(home: Path, *args: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), NO_COLOR="1")
    proc = subprocess.run(
        [AGENTPOST, "usage", *args, "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _home(tmp_path: Path, db_url: str, command: Path) -> Path:
    agent = {"provider": "claude", "timeout_seconds": 30, "command": [str(command)]}
    return make_home(tmp_path, db_url, {"coder": agent})


def test_two_runs_of_one_sender_show_the_tokens_and_cost_the_clireported(
    tmp_path: Path, db_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(None, Text("Done, and a few words more to count."))
    command, log = claude_tee(tmp_path)
    home = _home(tmp_path, db_url, command)
    env = cli_env(api, tmp_path)
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), "first question"
        )
        run_idle(rt, env=env)
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), "second question"
        )
        stats = run_idle(rt, env=env)
        assert stats.completed == 1
    results = reported(log)
    assert len(results) == 2
    want_input = sum(r["usage"]["input_tokens"] for r in results)
    want_output = sum(r["usage"]["output_tokens"] for r in results)
    want_cache_read = sum(r["usage"].get("cache_read_input_tokens", 0) for r in results)
    want_cache_write = sum(r["usage"].get("cache_creation_input_tokens", 0) for r in results)
    # Each run's own cost: the CLI's ``total_cost_usd`` adds up the session, and the second run resumed the
    # first one's conversation, so its total already holds the first run's cost.
    own = [own_cost(r) for r in results]
    want_cost = sum(own)
    assert want_cost == pytest.approx(results[-1]["total_cost_usd"], abs=1e-6)
    assert want_input > 0 and want_output > 0 and want_cost > 0

    (row,) = _usage_cli(home, "--by", "sender")
    assert row["key"] == "telegram:42"
    assert row["runs"] == 2
    assert (row["input_tokens"], row["output_tokens"]) == (want_input, want_output)
    assert (row["cache_read_tokens"], row["cache_write_tokens"]) == (want_cache_read, want_cache_write)
    assert row["cost_usd"] == pytest.approx(want_cost, abs=1e-6)

    (by_agent,) = _usage_cli(home, "--by", "agent", "--since", "1h")
    assert (by_agent["key"], by_agent["runs"]) == ("coder", 2)
    (by_chat,) = _usage_cli(home, "--by", "chat")
    assert by_chat["key"] == "telegram:c1"


def test_api_usage_groups_runs_like_the_cli_and_metrics_count_per_agent(tmp_path: Path) -> None:
    """``GET /api/usage`` sums what is recorded, by the grouping and period asked for; ``/metrics`` sums
    cost and tokens per agent over the last hour and day."""
    with contextlib.ExitStack() as stack:
        rt: Runtime = runtime_for(web_home(tmp_path))
        stack.callback(rt.close)
        now = now_ms()
        with rt.db.transaction() as tx:
            for agent, sender, cost, at in (
                ("coder", "telegram:1", 0.25, now),
                ("coder", "telegram:2", 0.5, now - 1000),
                ("writer", "telegram:1", 1.0, now - 3 * 86_400_000),
            ):
                record = UsageRecord(
                    agent=agent,
                    sender=sender,
                    channel="telegram",
                    conversation="c",
                    input_tokens=10,
                    output_tokens=7,
                    cache_read_tokens=3,
                    cache_write_tokens=1,
                    cost_usd=cost,
                )
                record_usage_in(tx, record, at=at)
        live = stack.enter_context(LiveServer(rt))
        client = stack.enter_context(live.client())
        by_agent = client.get("/api/usage", params={"by": "agent", "since": "7d"})
        assert by_agent.status_code == 200, by_agent.text
        assert [(r["key"], r["runs"], r["cost_usd"]) for r in by_agent.json()] == [
            ("writer", 1, 1.0),
            ("coder", 2, 0.75),
        ]
        (one,) = client.get("/api/usage", params={"by": "sender", "since": "1d"}).json()[1:]
        assert one == {
            "key": "telegram:1",
            "runs": 1,
            "input_tokens": 10,
            "output_tokens": 7,
            "cache_read_tokens": 3,
            "cache_write_tokens": 1,
            "cost_usd": 0.25,
        }
        refused = client.get("/api/usage", params={"since": "lately"})
        assert refused.status_code == 422 and "7d" in refused.text
        assert client.get("/api/usage", params={"by": "planet"}).status_code == 422
        metrics = client.get("/metrics").text
        assert 'agentpost_cost_usd{agent="coder",window="1h"} 0.75' in metrics
        assert 'agentpost_cost_usd{agent="coder",window="24h"} 0.75' in metrics
        assert 'agentpost_tokens{agent="coder",kind="input",window="24h"} 20.0' in metrics
        # writer's run was three days ago: outside both windows.
        assert 'agent="writer"' not in metrics


def test_a_sender_over_the_daily_budget_is_told_and_not_run_while_another_sender_is(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule(None, Text("Answered."))
    command, log = claude_tee(tmp_path)
    home = _home(tmp_path, sqlite_url, command)
    env = cli_env(api, tmp_path)
    with open_home(home) as rt:
        for text in ("one", "two"):
            rt.queue.intake.enqueue_message(
                ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), text
            )
            run_idle(rt, env=env)
        (spent,) = _usage_cli(home, "--by", "sender")
        limit = round(spent["cost_usd"] / 2, 4)
        # Live: the processor reads [budgets] again when the file changes, without a restart.
        with (home / "settings.toml").open("a") as f:
            f.write(f"\n[budgets]\nsender_daily_usd = {limit}\n")
        held = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), "three"
        )
        other = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "bob", sender_id="43", conversation="c2"), "hello"
        )
        runs_before = len(reported(log))
        run_idle(rt, env=env)
        assert len(reported(log)) == runs_before + 1  # bob's message ran, ann's did not
        assert rt.queue.admin.get_message(held.message_id).status == "dead"  # type: ignore[union-attr]
        assert rt.queue.admin.get_message(other.message_id).status == "completed"  # type: ignore[union-attr]
        replies = {
            r["conversation"]: r["message"]
            for r in rt.db.read(
                "SELECT conversation, message FROM responses WHERE message_id IN (:a, :b)",
                {"a": held.message_id, "b": other.message_id},
            )
        }
    told = replies["c1"]
    assert f"${spent['cost_usd']:.4f}" in told, told  # what was spent
    assert f"${limit:.4f}" in told, told  # the limit
    assert "resets at midnight UTC" in told, told  # and when it resets
    assert replies["c2"] == "Answered."
    by_sender = {r["key"]: r["runs"] for r in _usage_cli(home, "--by", "sender")}
    assert by_sender == {"telegram:42": 2, "telegram:43": 1}


def test_heartbeats_count_to_their_agent_overrides_and_exempt_senders(tmp_path: Path) -> None:
    """An agent's limit holds for its heartbeats too (no sender); ``[budgets.agents.<name>]`` overrides the
    section for one agent; an exempt sender is never held by a sender limit."""
    from workers.budgets import BudgetGate

    with contextlib.ExitStack() as stack:
        home = web_home(tmp_path)
        rt: Runtime = runtime_for(home)
        stack.callback(rt.close)
        with rt.db.transaction() as tx:
            record_usage_in(tx, UsageRecord(agent="alpha", cost_usd=0.6))  # a heartbeat's run
            record_usage_in(tx, UsageRecord(agent="alpha", sender="telegram:1", cost_usd=0.6))
        beat = rt.queue.intake.enqueue_message(
            ChatAddress("heartbeat", "heartbeat"), "check in", agent="alpha"
        )
        chat = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="1"), "hi", agent="alpha"
        )
        beat_msg, chat_msg = (
            rt.queue.admin.get_message(beat.message_id),
            rt.queue.admin.get_message(chat.message_id),
        )
        assert beat_msg is not None and chat_msg is not None
        settings_file = home / "settings.toml"
        base = settings_file.read_text()
        gate = BudgetGate(load_settings(home, {}))

        def budgets(text: str) -> None:
            settings_file.write_text(base + "\n" + text)

        budgets("[budgets]\nagent_daily_usd = 1.0\n")
        over = gate.over(rt.db, "alpha", beat_msg)
        assert over is not None and (over.whose, over.period, over.spent) == ("agent", "daily", 1.2)
        budgets("[budgets]\nagent_daily_usd = 1.0\n[budgets.agents.alpha]\nagent_daily_usd = 5.0\n")
        assert gate.over(rt.db, "alpha", beat_msg) is None
        budgets("[budgets]\nsender_monthly_usd = 0.5\n")
        over = gate.over(rt.db, "alpha", chat_msg)
        assert over is not None and (over.whose, over.who, over.period) == ("sender", "telegram:1", "monthly")
        assert gate.over(rt.db, "alpha", beat_msg) is None  # a heartbeat has no sender to hold
        budgets('[budgets]\nsender_monthly_usd = 0.5\nexempt_senders = ["telegram:1"]\n')
        assert gate.over(rt.db, "alpha", chat_msg) is None


def test_usage_chat_command_tells_the_sender_their_own_spend(tmp_path: Path, fake: HoldingTelegram) -> None:
    """``/usage`` in a Telegram chat: the sender's own cost today and this month, with their limits; in the
    channel's ``operator_chat`` also each agent's spend and who is over a limit."""
    telegram = {"allowlist": ["42", "43"], "operator_chat": "42", "poll_timeout_seconds": 1, "typing": False}
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": telegram})
    with (home / "settings.toml").open("a") as f:
        f.write("\n[budgets]\nsender_daily_usd = 2.5\nagent_daily_usd = 20\n")
    rt = open_home(home)
    try:
        with rt.db.transaction() as tx:
            record_usage_in(tx, UsageRecord(agent="alpha", sender="telegram:42", cost_usd=0.0123))
            record_usage_in(tx, UsageRecord(agent="alpha", sender="telegram:43", cost_usd=9.0))
            old = now_ms() - 40 * 86_400_000  # an earlier month: counted in neither
            record_usage_in(tx, UsageRecord(agent="alpha", sender="telegram:42", cost_usd=5.0), at=old)
        env = {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}
        with RunningChannel(TelegramChannel(rt, env=env)):
            fake.push_text(42, "/usage")
            fake.push_text(43, "/usage")
            wait_for(lambda: len(fake.texts(42)) == 1 and len(fake.texts(43)) == 1, 15, "/usage answered")
    finally:
        rt.close()
    (answer,) = fake.texts(42)
    assert "Today: $0.0123 of your $2.50 limit (resets at midnight UTC)." in answer, answer
    assert "This month: $0.0123 (no limit)." in answer, answer
    # The operator's chat: every agent, and who is over a limit.
    assert "@alpha: $9.01 of $20.00 today, $9.01 this month (2 runs this month)" in answer, answer
    assert "@beta: $0.0000 of $20.00 today, $0.0000 this month (0 runs this month)" in answer, answer
    assert "- sender telegram:43: $9.00 of the daily limit $2.50, resets at midnight UTC" in answer, answer
    (other,) = fake.texts(43)
    assert "Today: $9.00 of your $2.50 limit (resets at midnight UTC)." in other, other
    assert "@alpha" not in other and "telegram:42" not in other, other


def test_a_teammates_run_in_a_handoff_counts_to_the_person_who_started_the_chain(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    api.add_rule("build the thing", Text("On it. [@reviewer: please review the plan]"))
    api.add_rule("please review the plan", Text("Reviewed: looks good."))
    command, log = claude_tee(tmp_path)
    agent = {"provider": "claude", "timeout_seconds": 30, "command": [str(command)]}
    home = make_home(
        tmp_path,
        sqlite_url,
        {"lead": agent, "reviewer": agent},
        teams={"dev": {"agents": ["lead", "reviewer"], "leader": "lead"}},
    )
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), "@dev build the thing"
        )
        assert run_idle(rt, env=cli_env(api, tmp_path)).invocations == 2
        rows = rt.db.read(
            "SELECT agent, channel, conversation, sender, sender_name FROM run_usage ORDER BY id"
        )
    assert [dict(r) for r in rows] == [
        {
            "agent": a,
            "channel": "telegram",
            "conversation": "c1",
            "sender": "telegram:42",
            "sender_name": "ann",
        }
        for a in ("lead", "reviewer")
    ]
    (row,) = _usage_cli(home, "--by", "sender")
    assert row["runs"] == 2
    assert row["input_tokens"] == sum(r["usage"]["input_tokens"] for r in reported(log))


def test_api_usage_budgets_names_who_is_over_and_for_which_agents(tmp_path: Path) -> None:
    """``GET /api/usage/budgets``: a sender's limit set per agent holds for those agents only (and names its
    key); an exempt sender is never listed; an agent over its own limit is; no limit set says so."""
    with contextlib.ExitStack() as stack:
        home = web_home(tmp_path)
        rt: Runtime = runtime_for(home)
        stack.callback(rt.close)
        live = stack.enter_context(LiveServer(rt))
        client = stack.enter_context(live.client())
        assert client.get("/api/usage/budgets").json() == {"limits_set": False, "over": []}
        with rt.db.transaction() as tx:
            for sender, cost in (("telegram:1", 0.5), ("telegram:2", 2.0), ("telegram:9", 5.0)):
                record_usage_in(tx, UsageRecord(agent="alpha", sender=sender, cost_usd=cost))
        settings = home / "settings.toml"
        settings.write_text(
            settings.read_text() + "\n[budgets]\nsender_daily_usd = 1.0\nagent_monthly_usd = 7.5\n"
            'exempt_senders = ["telegram:9"]\n\n[budgets.agents.beta]\nsender_daily_usd = 0.1\n'
        )
        answer = wait_for(
            lambda: (r := client.get("/api/usage/budgets").json())["limits_set"] and r,
            10,
            "the web process to read the new budgets",
        )
    over = {(o["whose"], o["who"], o["limit_usd"]): o for o in answer["over"]}
    assert sorted(over) == [
        ("agent", "alpha", 7.5),
        ("sender", "telegram:1", 0.1),
        ("sender", "telegram:2", 0.1),
        ("sender", "telegram:2", 1.0),
    ], answer
    assert over[("agent", "alpha", 7.5)]["period"] == "monthly"
    assert over[("agent", "alpha", 7.5)]["spent_usd"] == 7.5
    beta_only = over[("sender", "telegram:1", 0.1)]
    assert (beta_only["agents"], beta_only["setting"]) == (["beta"], "budgets.agents.beta.sender_daily_usd")
    others = over[("sender", "telegram:2", 1.0)]
    assert (others["agents"], others["setting"]) == (["alpha", "gamma"], "budgets.sender_daily_usd")
    assert others["spent_usd"] == 2.0 and others["period"] == "daily"
    assert others["resets_at"] == next_day_start(now_ms())
