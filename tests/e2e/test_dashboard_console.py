"""The dashboard driven as a user in headless Chromium (Debian's chromium via Playwright) against real
processes: ``agentpost run web``, ``agentpost run processor`` with a scripted ``command`` agent, and
``agentpost run telegram`` against the fake Bot API. A chat reply rendered with its agent's name and its
Markdown, the history after a reload, a failing message going from "retrying" to the explanation, stopping a
run, adding an agent and talking to it, retrying a dead letter, approving a Telegram user's pairing request,
no sideways scroll at 390 px, and an axe-core scan with no serious or critical violation. Screenshots at
1280 px and 390 px are written to ``$AGENTPOST_SCREENSHOTS`` (default: the test's temporary folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import tomlkit

from tests.channel_support import (
    HoldingTelegram,
    Proc,
    count,
    free_port,
    open_home,
    stop_all,
    telegram_env,
    wait_for,
)
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)
from tests.web_support import CHROMIUM, CHROMIUM_ARGS, home_token, need_chromium, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[2]
AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"

#: The agent CLI: replies in Markdown with a code block; ``fail`` exits 3; ``sleep=S`` waits first.
AGENT = r"""
import os, sys, time
prompt = sys.stdin.read()
agent = os.environ.get("AGENTPOST_AGENT", "?")
words = prompt.split()
for w in words:
    if w.startswith("sleep="):
        time.sleep(float(w.split("=", 1)[1]))
if "fail" in words:
    print("the model endpoint refused the request", file=sys.stderr)
    sys.exit(3)
last = prompt.strip().splitlines()[-1] if prompt.strip() else ""
print(f"**{agent}** heard you.\n\n```python\nprint('<b>not bold</b>')\n```\n\nYou said: {last[-120:]}")
"""


def _home(tmp: Path, db_url: str = "") -> Path:
    home = tmp / "home"
    home.mkdir()
    script = tmp / "agent.py"
    script.write_text(AGENT, encoding="utf-8")
    command = [sys.executable, str(script)]
    data: dict[str, Any] = {
        "database": {"url": db_url or f"sqlite:///{tmp / 'a.db'}"},
        "queue": {
            "default_agent": "alpha",
            "lease_seconds": 3.0,
            "poll_interval_seconds": 0.5,
            "max_retries": 2,
            "backoff_base_seconds": 3.0,
            "backoff_max_seconds": 3.0,
        },
        "agents": {
            "alpha": {"name": "Alpha Helper", "provider": "command", "command": command},
            "beta": {"name": "Beta", "provider": "command", "command": command},
        },
        # A run still going when the test ends is cut short after 5 s (the default 20 s is past Proc.stop's).
        "processor": {"recover_interval_seconds": 0.5, "shutdown_grace_seconds": 5},
        "channels": {"telegram": {"poll_timeout_seconds": 1, "typing": False}},
    }
    (home / "settings.toml").write_text(tomlkit.dumps(data), encoding="utf-8")
    return home


def _need_chromium() -> None:
    need_chromium()
    if not AXE.exists():
        pytest.fail("node_modules/axe-core is missing: run npm ci")


def _axe(page: Any) -> list[str]:
    """Serious and critical axe-core violations on the page as it is now (one line each)."""
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    return [
        f"{v['id']} ({v['impact']}): {v['help']} — {[n['target'] for n in v['nodes']][:3]}"
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def _no_sideways_scroll(page: Any) -> None:
    widths = page.evaluate(
        "() => [document.documentElement.scrollWidth, document.body.scrollWidth, window.innerWidth]"
    )
    assert max(widths[0], widths[1]) <= widths[2], f"document {widths[:2]} wider than viewport {widths[2]}"


def test_dashboard_as_a_user(tmp_path: Path, db_url: str, fake: HoldingTelegram) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    shots = Path(os.environ.get("AGENTPOST_SCREENSHOTS") or tmp_path / "screenshots")
    shots.mkdir(parents=True, exist_ok=True)
    home = _home(tmp_path, db_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    web = Proc("web", home, {"AGENTPOST_API_PORT": str(port)}, tmp_path / "web.log")
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    telegram = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    rt = open_home(home)

    def healthy() -> bool:
        try:
            return httpx.get(url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, 90, "the web process")  # three processes start at once on a shared machine
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                context = browser.new_context(viewport={"width": 1280, "height": 860}, bypass_csp=True)
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                outside: list[str] = []
                page.on("request", lambda r: None if r.url.startswith(url) else outside.append(r.url))
                sign_in(page, url, token=home_token(home))  # the link `agentpost up` prints
                expect(page).to_have_title("agentpost")
                # First paint from REST: never an "offline" flash, no token banner once signed in.
                expect(page.locator("#conn")).not_to_have_text("offline")
                expect(page.locator("#conn")).to_have_text("live")
                expect(page.locator("#token-form")).to_be_hidden()
                assert httpx.get(url + "/favicon.ico").status_code == 200

                # A message and its reply: the agent's name, Markdown rendered, HTML in it left as text.
                page.fill("#chat-input", "hello from the browser")
                page.click("#chat-send")
                reply = page.locator(".chat-reply", has_text="You said: hello from the browser")
                expect(reply).to_be_visible(timeout=30_000)
                expect(reply.locator(".agent-name")).to_have_text("Alpha Helper")
                expect(reply.locator("strong")).to_have_text("alpha")
                expect(reply.locator("pre code")).to_have_text("print('<b>not bold</b>')")
                expect(reply.locator("pre b")).to_have_count(0)
                expect(page.locator(".chat-mine", has_text="hello from the browser")).to_be_visible()
                wait_for(
                    lambda: (
                        count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked' AND channel = 'web'")
                        == 1
                    ),
                    10,
                    "the reply acked once shown",
                )

                # Reload: the history is still there, and the chat is listed.
                page.reload()
                expect(
                    page.locator(".chat-reply", has_text="You said: hello from the browser")
                ).to_be_visible()
                expect(page.locator("#conv-list .conv[aria-current='true']")).to_contain_text("Your chat")
                assert _axe(page) == []

                # A failing message: "retrying" first, then the plain explanation.
                page.fill("#chat-input", "please fail now")
                page.keyboard.press("Enter")
                expect(page.get_by_text("retrying", exact=False).first).to_be_visible(timeout=20_000)
                failed = page.locator(".chat-failed")
                expect(failed).to_contain_text("could not answer", timeout=30_000)
                expect(page.locator(".chat-mine", has_text="please fail now")).to_contain_text("failed")
                dead_id = str(
                    rt.db.read_scalar("SELECT message_id FROM messages WHERE message = 'please fail now'")
                )
                # "/retry" typed in the chat box (what the explanation suggests) tries it once more.
                page.fill("#chat-input", "/retry")
                page.keyboard.press("Enter")
                # The page then shows it working on it again ("waiting" / "Retrying …").
                expect(page.locator("#run-state")).to_contain_text("etrying", timeout=20_000)
                wait_for(
                    lambda: (
                        rt.db.read_scalar(
                            "SELECT status FROM messages WHERE message_id = :m AND manual_retries = 1",
                            {"m": dead_id},
                        )
                        == "dead"
                    ),
                    40,
                    "the retried message to fail again",
                )

                # A long run shows "working" and is stopped with the Stop button.
                page.fill("#chat-input", "sleep=60 a long job")
                page.click("#chat-send")
                expect(page.locator("#run-state")).to_contain_text("is working on it", timeout=20_000)
                expect(page.locator("#chat-stop")).to_be_enabled()
                page.click("#chat-stop")
                expect(page.locator(".chat-stopped")).to_contain_text("Stopped", timeout=20_000)
                expect(page.locator("#run-state")).not_to_contain_text("is working on it")
                wait_for(
                    lambda: (
                        rt.db.read_scalar("SELECT status FROM messages WHERE message = 'sleep=60 a long job'")
                        != "processing"
                    ),
                    20,
                    "the run stopped",
                )

                # Add an agent and talk to it.
                page.click(".tab[data-view='agents']")
                expect(page.locator("#agents-table tr[data-agent='alpha']")).to_be_visible()
                page.click("#agent-add")
                page.fill("#af-id", "delta")
                page.fill("#af-name", "Delta Desk")
                page.select_option("#af-provider", "command")
                page.fill("#af-command", f"{sys.executable} {tmp_path / 'agent.py'}")
                page.click("#af-save")
                expect(page.locator("#agents-table tr[data-agent='delta']")).to_contain_text("Delta Desk")
                assert _axe(page) == []
                # Edit it, add and remove a team, reset an agent (the page asks first; the test agrees).
                page.on("dialog", lambda dialog: dialog.accept())
                page.locator("#agents-table tr[data-agent='delta'] button.edit").click()
                # The form opens once it holds the saved values (no late overwrite of what is typed).
                expect(page.locator("#agent-form")).to_be_visible()
                expect(page.locator("#af-name")).to_have_value("Delta Desk")
                page.select_option("#af-permission", "plan")
                page.fill("#af-timeout", "900")
                page.click("#af-save")
                expect(page.locator("#agent-form")).to_be_hidden()
                saved = httpx.get(
                    url + "/api/settings", headers={"Authorization": f"Bearer {home_token(home)}"}
                ).json()["agents"]["delta"]
                assert saved["permission_mode"] == "plan" and saved["timeout_seconds"] == 900
                page.click("#team-add")
                page.fill("#tf-id", "crew")
                page.fill("#tf-agents", "alpha, delta")
                page.fill("#tf-leader", "alpha")
                page.locator("#team-form button[type='submit']").click()
                expect(page.locator("#teams-table tr[data-team='crew']")).to_contain_text("@delta")
                page.locator("#teams-table tr[data-team='crew'] button.danger").click()
                expect(page.locator("#teams-table tr[data-team='crew']")).to_have_count(0)
                # The busy policy for every agent, steer included.
                page.select_option("#pf-busy", "steer")
                page.locator("#processor-form button[type='submit']").click()
                expect(page.locator("#processor-saved")).to_have_text("Saved.")
                assert 'busy_policy = "steer"' in (home / "settings.toml").read_text()
                page.locator("#agents-table tr[data-agent='beta'] button.reset").click()
                wait_for(
                    lambda: count(rt, "SELECT COUNT(*) FROM events WHERE type = 'agent_reset'") >= 1,
                    10,
                    "reset",
                )
                expect(page.locator("#agents-error")).to_be_hidden()
                page.screenshot(path=str(shots / "dashboard-desktop-agents.png"), full_page=True)
                page.click(".tab[data-view='chat']")
                page.select_option("#chat-agent", "delta")
                page.fill("#chat-input", "are you there delta")
                page.click("#chat-send")
                answer = page.locator(".chat-reply", has_text="You said: are you there delta")
                expect(answer).to_be_visible(timeout=40_000)
                expect(answer.locator(".agent-name")).to_have_text("Delta Desk")
                page.screenshot(path=str(shots / "dashboard-desktop.png"), full_page=False)

                # Operations: the dead letter with its error on demand and the budget; retry it.
                page.click(".tab[data-view='ops']")
                row = page.locator(f"#dead-list li[data-id='{dead_id}']")
                expect(row).to_contain_text("1 of 3 manual retries used")
                row.locator("summary").click()
                expect(row.locator(".error-text")).to_contain_text("the model endpoint refused the request")
                row.locator("button.retry").click()
                wait_for(
                    lambda: (
                        int(
                            rt.db.read_scalar(
                                "SELECT manual_retries FROM messages WHERE message_id = :m", {"m": dead_id}
                            )
                        )
                        == 2
                    ),
                    10,
                    "the dead letter retried",
                )

                # A Telegram user asks to talk; approving them on the page gets them the answer.
                fake.push_text(77, "what is in the box")
                pending = page.locator("#pairing-pending li[data-sender='77']")
                expect(pending).to_be_visible(timeout=30_000)
                pending.locator("button.approve").click()
                wait_for(
                    lambda: any("You said: what is in the box" in t for t in fake.texts(77)), 40, "the answer"
                )
                expect(page.locator("#pairing-approved li[data-sender='77']")).to_be_visible()
                expect(page.locator("#channels li[data-channel='telegram']")).to_contain_text("connected")
                assert _axe(page) == []
                page.screenshot(path=str(shots / "dashboard-desktop-operations.png"), full_page=True)

                # A phone: no sideways scroll in any view, no serious accessibility problem.
                phone = browser.new_context(
                    viewport={"width": 390, "height": 844}, device_scale_factor=2, bypass_csp=True
                )
                mobile = phone.new_page()
                mobile.on("pageerror", lambda exc: errors.append(str(exc)))
                mobile.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
                sign_in(mobile, url, "#ops", token=home_token(home))
                expect(mobile.locator("#conn")).to_have_text("live")
                expect(mobile.locator("#dead-list li").first).to_be_visible()
                _no_sideways_scroll(mobile)
                mobile.screenshot(path=str(shots / "dashboard-phone-operations.png"), full_page=True)
                mobile.click(".tab[data-view='agents']")
                expect(mobile.locator("#agents-table tr[data-agent='delta']")).to_be_visible()
                _no_sideways_scroll(mobile)
                mobile.screenshot(path=str(shots / "dashboard-phone-agents.png"), full_page=True)
                mobile.click(".tab[data-view='chat']")
                expect(mobile.locator("#conv-list li").first).to_be_visible()
                mobile.locator("#conv-list .conv", has_text="on telegram").click()
                expect(mobile.locator(".chat-reply", has_text="what is in the box")).to_be_visible()
                _no_sideways_scroll(mobile)
                assert _axe(mobile) == []
                mobile.screenshot(path=str(shots / "dashboard-phone.png"), full_page=False)
                assert errors == []
                assert outside == []
            finally:
                browser.close()
    finally:
        stop_all(telegram, processor, web)
        rt.close()


def test_token_banner_only_when_the_server_asks_for_one(tmp_path: Path) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    home = _home(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    web = Proc(
        "web",
        home,
        {"AGENTPOST_API_PORT": str(port), "AGENTPOST_API_TOKEN": "s3cret-token"},
        tmp_path / "w.log",
    )
    try:
        wait_for(lambda: _answers(url), 90, "the web process")
        assert httpx.get(url + "/access").json() == {"tokenRequired": True, "signedIn": False}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            try:
                page = browser.new_page()
                page.goto(url + "/")
                expect(page.locator("#token-form")).to_be_visible()
                page.fill("#token-input", "s3cret-token")
                page.click("#token-form button[type='submit']")
                expect(page.locator("#token-form")).to_be_hidden()
                expect(page.locator("#conn")).to_have_text("live")
                expect(page.locator("#conv-list li").first).to_contain_text("Your chat")
            finally:
                browser.close()
    finally:
        web.stop()


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
