"""Agents asking before a tool runs, in the dashboard: headless Chromium (Debian's chromium driven by Playwright)
against the web app served by uvicorn, with the page's Content-Security-Policy in force. The test
writes the requests as a run in ``permission_mode = "ask"`` does (:func:`shared.queue.approvals.ask`, the
question queued to the chat in the same transaction) and reads what the buttons did from the database.

* In the dashboard's own web chat the question shows with Allow / Deny / Allow for this chat; Allow decides it
  (the request is ``allowed`` in the database) and the question then shows what became of it, buttons gone.
* The Operations page lists every request still waiting (agent, tool, what exactly, the chat, since when, the
  time left), a new one appears without a reload, and its Deny button decides it.
* Both views pass axe-core (no serious or critical violations) on a phone, and the agent form keeps an agent's
  ``permission_mode = "ask"`` when it is edited and saved.

Screenshots at 1280 px and 390 px go to ``$AGENTPOST_SCREENSHOTS`` (default: the test's temporary folder;
docs/screenshots/ holds approval-desktop.png, approval-phone.png and approvals-operations.png)."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.queue import approvals
from shared.runtime import Runtime
from shared.storage.statuses import ApprovalStatus
from tests.approval_support import ask_for_bash
from tests.e2e.test_dashboard_console import _axe, _need_chromium, _no_sideways_scroll
from tests.web_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    LiveServer,
    make_home,
    runtime_for,
    sign_in,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TELEGRAM = ChatAddress("telegram", "Ann", sender_id="42", conversation="42")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("AGENTPOST_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Runtime, str]]:
    """The web app served by uvicorn over a home (agents alpha, beta, gamma, and delta that asks, on SQLite),
    and the runtime under it, for the test to write and read the database."""
    home = make_home(tmp_path, extra='\n[agents.delta]\nname = "Delta"\npermission_mode = "ask"\n')
    rt = runtime_for(home)
    try:
        with LiveServer(rt) as live:
            yield rt, live.url
    finally:
        rt.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    _need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def open_page(browser: Any, url: str, fragment: str = "", width: int = 1280) -> tuple[Any, list[str]]:
    """A signed-in page connected to the live feed, and the errors it logs (a CSP violation is one)."""
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    sign_in(page, url, fragment)
    expect(page.locator("#conn")).to_have_text("live")
    return page, errors


def ask(rt: Runtime, chat: ChatAddress | None, command: str, message_id: str, minutes: int = 10) -> str:
    """Write a request of alpha for ``command`` as a run asking before Bash does; its id."""
    return ask_for_bash(rt, chat, message_id, command=command, run_id="run-1", timeout_ms=minutes * 60_000).id


def status_of(rt: Runtime, approval_id: str) -> str:
    found = approvals.get(rt.db, approval_id)
    assert found is not None
    return found.status


def test_the_web_chat_shows_the_question_and_allow_answers_it(
    served: tuple[Runtime, str], browser: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    rt, url = served
    page, errors = open_page(browser, url)
    page.fill("#chat-input", "Tidy the build folder, please")
    page.click("#chat-send")
    expect(page.locator("#chat-input")).to_have_value("")
    (row,) = wait_until(
        lambda: rt.db.read("SELECT message_id, conversation FROM messages WHERE channel = 'web'"),
        10,
        "the message queued",
    )
    chat = ChatAddress("web", "web", conversation=str(row["conversation"]))

    first = ask(rt, chat, "ls -la build", str(row["message_id"]))
    question = page.locator(".chat-approval:has(button[data-decision='allow'])")
    expect(question).to_contain_text("Alpha")
    expect(question).to_contain_text("alpha asks to use Bash:")
    expect(question).to_contain_text("ls -la build")
    expect(question.locator("button")).to_have_text(["Allow", "Deny", "Allow for this chat"])

    question.locator("button[data-decision='allow']").click()
    wait_until(lambda: status_of(rt, first) == ApprovalStatus.ALLOWED, 10, "the request allowed")
    decided = page.locator(".chat-approval.decided")
    expect(decided).to_have_count(1)
    expect(decided).to_contain_text("✅ Allowed by operator — Bash: ls -la build")
    expect(page.locator(".approval-actions")).to_have_count(0)
    expect(page.locator(".chat-approval")).to_have_count(1)  # shown in the question's place, not again below
    stored = approvals.get(rt.db, first)
    assert stored is not None and (stored.decided_by, stored.decided_via) == ("operator", "api")

    # The next request waits with its buttons under the one already answered (the screenshots' state).
    second = ask(rt, chat, "rm -rf build/cache", str(row["message_id"]))
    expect(page.locator(".chat-approval:not(.decided)")).to_contain_text("rm -rf build/cache")
    expect(page.locator(".approval-actions button")).to_have_count(3)
    page.screenshot(path=str(shots / "approval-desktop.png"))
    page.set_viewport_size({"width": 390, "height": 844})
    page.evaluate("document.querySelector('#chat-log').scrollIntoView({block: 'end'})")
    _no_sideways_scroll(page)
    page.screenshot(path=str(shots / "approval-phone.png"))
    assert status_of(rt, second) == ApprovalStatus.PENDING
    assert errors == []


def test_the_operations_page_lists_waiting_requests_and_deny_answers_one(
    served: tuple[Runtime, str], browser: Any, shots: Path
) -> None:
    from playwright.sync_api import expect

    rt, url = served
    message = rt.queue.intake.enqueue_message(TELEGRAM, "deploy the site")
    deploy = ask(rt, TELEGRAM, "./deploy.sh --prod", message.message_id)
    page, errors = open_page(browser, url, "#ops")
    item = page.locator(f"#approval-list li[data-id='{deploy}']")
    expect(item).to_contain_text("Alpha asks to use Bash")
    expect(item.locator(".approval-what")).to_have_text("./deploy.sh --prod")
    expect(item).to_contain_text("chat on telegram · Ann")
    expect(item).to_contain_text("waiting since")
    expect(item.locator(".time-left")).to_contain_text(" min left")

    # A request written while the page is open shows up without a reload (its event refreshes the list).
    nightly = ask(rt, None, "make nightly-report", "", minutes=5)
    expect(page.locator("#approval-list li.approval")).to_have_count(2)
    later = page.locator(f"#approval-list li[data-id='{nightly}']")
    expect(later).to_contain_text("no chat (a scheduled run: only an operator can answer)")
    expect(later.locator("button")).to_have_text(["Allow", "Deny"])  # no chat to allow it for
    page.locator("#approval-list").locator("xpath=..").screenshot(
        path=str(shots / "approvals-operations.png")
    )

    item.locator("button[data-decision='deny']").click()
    wait_until(lambda: status_of(rt, deploy) == ApprovalStatus.DENIED, 10, "the request denied")
    expect(item).to_have_count(0)
    expect(page.locator("#approval-list li.approval")).to_have_count(1)
    assert status_of(rt, nightly) == ApprovalStatus.PENDING
    told = rt.db.read("SELECT message FROM responses WHERE channel = 'telegram' ORDER BY id")
    assert told[-1]["message"] == "🚫 Denied by operator — not run: Bash: ./deploy.sh --prod"
    page.set_viewport_size({"width": 390, "height": 844})
    _no_sideways_scroll(page)
    assert errors == []


def test_approvals_pass_axe_and_the_agent_form_keeps_ask(served: tuple[Runtime, str], browser: Any) -> None:
    from playwright.sync_api import expect

    rt, url = served
    page, errors = open_page(browser, url, "#agents")
    page.click("tr[data-agent='delta'] button.edit")
    expect(page.locator("#af-permission")).to_have_value("ask")  # an edit saves it back, not a blank
    page.click("#af-save")
    expect(page.locator("#agent-form")).to_be_hidden()
    saved = tomllib.loads((rt.settings.home / "settings.toml").read_text(encoding="utf-8"))
    assert saved["agents"]["delta"]["permission_mode"] == "ask"
    assert errors == []

    message = rt.queue.intake.enqueue_message(TELEGRAM, "deploy the site")
    ask(rt, TELEGRAM, "./deploy.sh --prod", message.message_id)
    # The policy lifted only so the checker's script can be added.
    page = browser.new_context(viewport={"width": 390, "height": 844}, bypass_csp=True).new_page()
    sign_in(page, url, "#ops")
    expect(page.locator("#approval-list li.approval")).to_have_count(1)
    assert _axe(page) == []
    page.locator("#approval-list button.link").click()  # opens the chat the request was asked in
    expect(page.locator(".chat-approval .approval-actions button")).to_have_count(3)
    assert _axe(page) == []
