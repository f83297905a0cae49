"""The dashboard's costs view in headless Chromium (Debian's chromium via Playwright), against
``agentpost run web`` as its own process, with the page's Content-Security-Policy in force.

The usage it shows was recorded by real runs: the processor ran the real Claude Code CLI against the fake
Messages API, and the test sums the CLI's own ``result`` lines for the figures it expects. A sender then goes
over ``[budgets] sender_daily_usd``; their next message is not run and the view names them, what they spent,
the limit and when it resets. Screenshots at 1280 px and 390 px go to ``$AGENTPOST_SCREENSHOTS`` (default:
the test's temporary folder; docs/screenshots/ holds the ones docs/usage.md shows)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.reads.usage import UsageRecord, day_of, record_usage_in, usd
from tests.e2e.test_dashboard_console import _axe, _need_chromium, _no_sideways_scroll
from tests.fakes.anthropic_api import FakeAnthropic, Text
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.homes import open_home
from tests.processor_support import make_home, run_idle
from tests.usage_support import claude_tee, cli_env, own_cost, reported
from tests.web_support import CHROMIUM, CHROMIUM_ARGS, free_port, sign_in, web_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

DAY_MS = 86_400_000


def _browser_errors(page: Any, errors: list[str]) -> None:
    # A CSP violation is a console error: the view must draw its chart without inline script or style.
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)


def test_costs_view_shows_each_agents_cost_today_and_who_is_over_budget(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    shots = Path(os.environ.get("AGENTPOST_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    api.add_rule(None, Text("Done."))
    command, log = claude_tee(tmp_path)
    agent = {"provider": "claude", "timeout_seconds": 30, "command": [str(command)]}
    home = make_home(tmp_path, sqlite_url, {"coder": {**agent, "name": "Coder"}, "writer": agent})
    env = cli_env(api, tmp_path)
    with open_home(home) as rt:
        # Two runs of coder for Ann, one of writer for Bob: the CLI reports what each cost.
        for text in ("first question", "second question"):
            rt.queue.intake.enqueue_message(
                ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), text, agent="coder"
            )
            run_idle(rt, env=env)
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "bob", sender_id="43", conversation="c2"), "a poem", agent="writer"
        )
        run_idle(rt, env=env)
        results = reported(log)
        assert len(results) == 3
        coder_today, writer_today = own_cost(results[0]) + own_cost(results[1]), own_cost(results[2])
        assert coder_today > 0 and writer_today > 0
        # Earlier days for the chart (a heartbeat's run has no sender).
        now = now_ms()
        with rt.db.transaction() as tx:
            for days_ago, cost in ((1, 0.0412), (3, 0.0207), (9, 0.0150)):
                record_usage_in(tx, UsageRecord(agent="writer", cost_usd=cost), at=now - days_ago * DAY_MS)
        # Ann goes over a daily budget; her next message is not run.
        limit = round(coder_today / 2, 4)
        with (home / "settings.toml").open("a") as f:
            f.write(f"\n[budgets]\nsender_daily_usd = {limit}\n")
        held = rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="c1"), "third", agent="coder"
        )
        run_idle(rt, env=env)
        message = rt.queue.admin.get_message(held.message_id)
        assert message is not None and message.status == "dead"
        assert len(reported(log)) == 3

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with web_process(home, port), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            errors: list[str] = []
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            _browser_errors(page, errors)
            sign_in(page, url, "#usage")
            expect(page.locator("#view-usage")).to_be_visible()

            # Cost today per agent: exactly what the CLI reported for its runs, written as agentpost writes it.
            coder = page.locator("#agent-cost tr[data-agent='coder']")
            expect(coder.locator("td.today")).to_have_text(usd(coder_today))
            expect(coder.locator("th")).to_contain_text("Coder")
            expect(page.locator("#agent-cost tr[data-agent='writer'] td.today")).to_have_text(
                usd(writer_today)
            )
            expect(coder.locator("td.runs")).to_have_text("2")
            # The top senders: Ann's two runs, then Bob's one.
            senders = page.locator("#sender-cost tbody tr")
            expect(senders).to_have_count(2)
            expect(senders.nth(0)).to_have_attribute("data-sender", "telegram:42")
            expect(senders.nth(0).locator("td.today")).to_have_text(usd(coder_today))
            # The chart: a bar a day, today's holding both agents' runs.
            expect(page.locator("#day-chart rect.bar")).to_have_count(14)
            today_bar = page.locator(f"#day-chart rect.bar[data-day='{day_of(now)}'] title")
            expect(today_bar).to_have_text(f"{day_of(now)}: {usd(coder_today + writer_today)} (3 runs)")
            earlier = page.locator(f"#day-chart rect.bar[data-day='{day_of(now - 3 * DAY_MS)}'] title")
            expect(earlier).to_have_text(f"{day_of(now - 3 * DAY_MS)}: $0.0207 (1 run)")
            # Over budget: who, what was spent, the limit, when it resets; the tab says so from any view.
            over = page.locator("#over-list li[data-who='telegram:42']")
            expect(over).to_contain_text(
                f"Sender telegram:42 has spent {usd(coder_today)} of the daily limit"
            )
            expect(over).to_contain_text(usd(limit))
            expect(over).to_contain_text("Resets midnight UTC")
            expect(page.locator("#over-list li")).to_have_count(1)
            expect(page.locator("#over-badge")).to_have_text("1 over budget")
            expect(page.locator("#usage-empty")).to_be_hidden()
            page.screenshot(path=str(shots / "usage-desktop.png"), full_page=True)

            phone = browser.new_page(viewport={"width": 390, "height": 844}, device_scale_factor=2)
            _browser_errors(phone, errors)
            sign_in(phone, url, "#usage")
            expect(phone.locator("#agent-cost tr[data-agent='coder'] td.today")).to_have_text(
                usd(coder_today)
            )
            expect(phone.locator("#day-chart rect.bar")).to_have_count(14)
            width = phone.locator("#day-chart svg").evaluate("(svg) => svg.getBoundingClientRect().width")
            assert width <= 390
            _no_sideways_scroll(phone)
            phone.screenshot(path=str(shots / "usage-phone.png"), full_page=True)
            assert errors == []

            # Accessibility, with the policy lifted only so the checker's script can be added.
            checked = browser.new_context(viewport={"width": 390, "height": 844}, bypass_csp=True).new_page()
            sign_in(checked, url, "#usage")
            expect(checked.locator("#over-list li")).to_have_count(1)
            assert _axe(checked) == []
        finally:
            browser.close()


def test_costs_view_says_when_no_run_is_recorded_yet(tmp_path: Path, sqlite_url: str) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    home = make_home(tmp_path, sqlite_url, {"coder": {"provider": "claude"}})
    open_home(home).close()  # the schema, as `agentpost init` leaves it
    port = free_port()
    with web_process(home, port), sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            errors: list[str] = []
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            _browser_errors(page, errors)
            sign_in(page, f"http://127.0.0.1:{port}")
            expect(page.locator("#over-badge")).to_be_hidden()
            page.click(".tab[data-view='usage']")
            expect(page.locator("#usage-empty")).to_be_visible()
            expect(page.locator("#usage-empty h2")).to_have_text("No runs recorded yet")
            expect(page.locator("#agent-cost tr[data-agent='coder'] td.today")).to_have_text("$0.0000")
            expect(page.locator("#sender-cost tbody")).to_contain_text("No one has sent a message")
            expect(page.locator("#budgets-state")).to_contain_text("No budgets are set")
            expect(page.locator("#day-chart")).to_contain_text("$0.0000 over these 14 days")
            assert errors == []
        finally:
            browser.close()
