"""The dashboard's details of issue 24, in headless Chromium (Debian's chromium driven by Playwright) over a real
server and SQLite; the test plays the processor through the real queue API. Each test also fails on any error
the page logs to the browser console (a refused request the test makes on purpose excepted).

* an ``@agent`` typed at the start of a message wins over the agent chosen in the list, and an unknown
  ``@name`` is refused with the names there are (the routing of every other channel);
* a chat action's confirmation ("… starts a fresh conversation") stays until dismissed;
* the agent and team id fields validate in Chromium (their ``pattern`` compiles with the ``v`` flag), and the
  server's refusal of a bad id is in words;
* the chat list keeps the underscores of a ref such as ``tg_123_abc``;
* "replies out" goes back to 0 after a dead-letter Retry answered while another view is open;
* a 120 KB message is shown collapsed with a "Show all" button.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.web_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    LiveServer,
    home_runtime,
    kill_until_dead,
    need_chromium,
    play_processor,
    sign_in,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ID_WORDS = "lowercase letters, digits, - and _, starting with a letter or digit, at most 32"


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)  # agents alpha (default), beta, gamma; team dev led by beta


class Console:
    """What the page reported as errors: uncaught exceptions and console errors. A request the test makes
    fail on purpose is logged by Chromium as "Failed to load resource … status of N"; ``expected`` lists
    those statuses."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        self.expected: set[int] = set()
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error" else None)

    def unexpected(self) -> list[str]:
        allowed = re.compile(r"Failed to load resource: the server responded with a status of (\d+)")
        out = []
        for e in self.errors:
            m = allowed.search(e)
            if m is None or int(m.group(1)) not in self.expected:
                out.append(e)
        return out


@contextlib.contextmanager
def dashboard(rt: Runtime, width: int = 1280) -> Iterator[tuple[LiveServer, Any, Console]]:
    """A page on a live server, loaded and connected to the live feed; fails on unexpected console errors."""
    need_chromium()
    from playwright.sync_api import expect, sync_playwright

    with LiveServer(rt) as live, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            console = Console(page)
            sign_in(page, live.url)
            expect(page.locator("#conn")).to_have_text("live")
            yield live, page, console
            assert console.unexpected() == []
        finally:
            browser.close()


def web_rows(rt: Runtime) -> list[dict[str, Any]]:
    return rt.db.read("SELECT message, agent FROM messages WHERE channel = 'web' ORDER BY id")


def send(page: Any, text: str, *, accepted: bool = True) -> None:
    """Type ``text`` and send it; when ``accepted``, wait until the box is empty again (the server took it)."""
    from playwright.sync_api import expect

    page.fill("#chat-input", text)
    page.click("#chat-send")
    if accepted:
        expect(page.locator("#chat-input")).to_have_value("")


def test_a_name_typed_in_the_message_wins_over_the_agent_chosen(rt: Runtime) -> None:
    from playwright.sync_api import expect

    with dashboard(rt) as (_, page, console):
        page.select_option("#chat-agent", "gamma")
        send(page, "@beta please look")
        wait_until(lambda: web_rows(rt), 10, "the message queued")
        assert web_rows(rt) == [{"message": "@beta please look", "agent": "beta"}]
        expect(page.locator(".chat-mine", has_text="@beta please look")).to_contain_text("→ @beta")

        # A team named in the text goes to its leader; no name: the agent in the list.
        send(page, "@dev: a plan")
        send(page, "just words")
        wait_until(lambda: len(web_rows(rt)) == 3, 10, "three messages queued")
        assert [r["agent"] for r in web_rows(rt)] == ["beta", "beta", "gamma"]

        # An unknown name is refused with the names there are; nothing is queued, the text stays to fix.
        console.expected.add(400)
        send(page, "@nobody are you there", accepted=False)
        error = page.locator("#chat-error")
        expect(error).to_be_visible()
        expect(error).to_have_text(
            "There is no agent or team called @nobody here, so your message was not sent. "
            "Agents: @alpha, @beta, @gamma. Teams: @dev."
        )
        expect(page.locator("#chat-input")).to_have_value("@nobody are you there")
        assert len(web_rows(rt)) == 3
        # The next message sent clears the refusal.
        send(page, "@alpha fine then")
        expect(error).to_be_hidden()
        wait_until(lambda: len(web_rows(rt)) == 4, 10, "the fourth message queued")
        assert web_rows(rt)[-1] == {"message": "@alpha fine then", "agent": "alpha"}


def test_the_reset_confirmation_stays_until_dismissed(rt: Runtime) -> None:
    from playwright.sync_api import expect

    with dashboard(rt) as (_, page, _console):
        page.select_option("#chat-agent", "beta")
        page.click("#chat-reset")
        said = page.get_by_text("Beta starts a fresh conversation with your next message.")
        expect(said).to_be_visible()
        # Watch it: the run-state line is redrawn every second and on every event; the confirmation must not
        # flicker away with it. A message in another chat makes the page refresh meanwhile.
        page.evaluate(
            """() => {
              window.__noticeGone = 0;
              const card = document.querySelector('.card.chat');
              const shown = () => Array.from(card.querySelectorAll('p')).some(
                (p) => p.offsetParent !== null && p.textContent.includes('starts a fresh conversation'));
              new MutationObserver(() => { if (!shown()) window.__noticeGone++; })
                .observe(card, { attributes: true, childList: true, subtree: true, characterData: true });
            }"""
        )
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "bob", conversation="tg-9"), "meanwhile elsewhere"
        )
        expect(page.locator("#st-pending")).to_have_text("1")
        # A claim about duration: it is still there after several refresh ticks (the old one went in < 1 s).
        page.wait_for_timeout(3500)
        expect(said).to_be_visible()
        assert page.evaluate("window.__noticeGone") == 0
        page.click("#chat-notice-close")
        expect(said).to_be_hidden()
        # Sending a message puts it behind: the next confirmation goes when the next message is sent.
        page.click("#chat-reset")
        expect(said).to_be_visible()
        send(page, "a fresh start")
        expect(said).to_be_hidden()


def test_the_id_fields_validate_in_chromium_and_the_server_refuses_in_words(rt: Runtime) -> None:
    from playwright.sync_api import expect

    with dashboard(rt) as (_, page, console):
        page.click(".tab[data-view='agents']")
        page.click("#agent-add")
        field = page.locator("#af-id")
        expect(field).to_be_visible()
        verdicts = {}
        for value in ["Bad Id", "-dash", "under_score-ok", "a" * 32, "café", "x"]:
            field.fill(value)
            verdicts[value] = field.evaluate("(el) => !el.validity.patternMismatch")
        assert verdicts == {
            "Bad Id": False,
            "-dash": False,
            "under_score-ok": True,
            "a" * 32: True,
            "café": False,
            "x": True,
        }
        # The browser itself stops the form and says the rule in words.
        field.fill("Bad Id")
        page.click("#af-save")
        assert field.evaluate("(el) => el.matches(':invalid')")
        assert field.evaluate("(el) => el.validationMessage") == f"Use {ID_WORDS} characters."
        # The team id field too.
        page.click("#team-add")
        team_id = page.locator("#tf-id")
        team_id.fill("Crew")
        assert team_id.evaluate("(el) => el.validity.patternMismatch")
        team_id.fill("crew")
        assert not team_id.evaluate("(el) => el.validity.patternMismatch")
        # A refusal shown while typing does not stick to a value the page fills in itself (editing a team).
        team_id.fill("Crew")
        page.click("#tf-cancel")
        page.locator("#teams-table tr[data-team='dev'] button", has_text="Edit").click()
        expect(team_id).to_have_value("dev")
        page.locator("#team-form button[type='submit']").click()
        expect(page.locator("#team-form")).to_be_hidden()

        # A client that skips the check (or an older page) gets the server's refusal, in words too.
        console.expected.add(400)
        page.evaluate("document.querySelector('#agent-form').noValidate = true")
        field.fill("Bad Id")
        page.click("#af-save")
        error = page.locator("#agent-form-error")
        expect(error).to_have_text(f"The agent id 'Bad Id' is not allowed: use {ID_WORDS} characters.")
        assert "Bad Id" not in rt.settings.path.read_text(encoding="utf-8")
    # No "Pattern attribute value … is not a valid regular expression" (checked by dashboard()).


def test_the_chat_list_keeps_underscores(rt: Runtime) -> None:
    from playwright.sync_api import expect

    rt.queue.intake.enqueue_message(
        ChatAddress("telegram", "", conversation="tg_123_abc"),
        "look at ref tg_123_abc and snake_case_name, **bold**, _slanted_ and `code_span`",
    )
    with dashboard(rt) as (_, page, _console):
        row = page.locator("#conv-list .conv[data-conversation='tg_123_abc']")
        expect(row.locator(".conv-who")).to_have_text("tg_123_abc on telegram")
        expect(row.locator(".conv-last")).to_have_text(
            "look at ref tg_123_abc and snake_case_name, bold, slanted and code_span"
        )
        row.click()
        expect(page.locator("#chat-title")).to_have_text("tg_123_abc on telegram")


def test_replies_out_goes_back_to_zero_after_a_dead_letter_retry(rt: Runtime) -> None:
    from playwright.sync_api import expect

    with dashboard(rt) as (_, page, _console):
        send(page, "this will fail first")
        wait_until(lambda: web_rows(rt), 10, "the message queued")
        (dead,) = kill_until_dead(rt.queue, "alpha")
        expect(page.locator(".chat-failed")).to_contain_text("could not answer")
        expect(page.locator("#st-responses")).to_have_text("0")

        # Retried from Operations; the answer comes while that view is open.
        page.click(".tab[data-view='ops']")
        page.click(f"#dead-list button.retry[data-id='{dead}']")
        expect(page.locator(f"#dead-list li[data-id='{dead}']")).to_have_count(0)
        assert play_processor(rt.queue, "alpha", lambda m: "second time lucky") == [dead]
        # The reply reached this browser: not "out" any more, and the Chats tab says there is a new one.
        expect(page.locator("#st-responses")).to_have_text("0")
        expect(page.locator("#unread")).to_have_text("1 new")
        wait_until(
            lambda: (
                rt.db.read_scalar("SELECT status FROM responses WHERE message = 'second time lucky'")
                == "acked"
            ),
            10,
            "the reply delivered to the page",
        )
        page.click(".tab[data-view='chat']")
        expect(page.locator(".chat-reply", has_text="second time lucky")).to_be_visible()
        expect(page.locator("#unread")).to_be_hidden()
        expect(page.locator("#st-responses")).to_have_text("0")


def test_a_120_kb_message_is_collapsed_with_show_all(rt: Runtime) -> None:
    from playwright.sync_api import expect

    lines = [f"line {n:05d} " + "x" * 110 for n in range(1000)]  # ~120 KB
    big = "\n".join(lines)
    assert len(big) > 120_000
    with dashboard(rt) as (_, page, _console):
        send(page, "send me the whole log")
        wait_until(lambda: web_rows(rt), 10, "the message queued")
        play_processor(rt.queue, "alpha", lambda m: big)
        reply = page.locator(".chat-reply", has_text="line 00000")
        expect(reply).to_be_visible()
        button = reply.locator("button.show-all")
        expect(button).to_have_text(f"Show all ({len(big):,} characters)")
        expect(button).to_have_attribute("aria-expanded", "false")
        shown = len(reply.locator(".md").inner_text())
        assert shown < 2000, shown
        expect(reply).not_to_contain_text("line 00999")
        expect(reply.locator(".cut-note")).to_contain_text(f"of {len(big):,} characters")

        button.click()
        expect(reply).to_contain_text("line 00999")
        assert len(reply.locator(".md").inner_text()) >= len(big) - 1000
        expect(button).to_have_text("Show less")
        # Stays open across the page's refreshes (a message elsewhere makes it refresh), then folds again.
        rt.queue.intake.enqueue_message(ChatAddress("telegram", "bob", conversation="tg-1"), "elsewhere")
        expect(page.locator("#st-pending")).to_have_text("1")
        expect(reply).to_contain_text("line 00999")
        button.click()
        expect(reply).not_to_contain_text("line 00999")

        # An ordinary long-winded message (5,000 characters in 50 lines) is shown whole.
        medium = "\n".join(f"point {n}: " + "word " * 19 for n in range(50))
        assert 4500 < len(medium) < 6000
        send(page, medium)
        mine = page.locator(".chat-mine", has_text="point 49:")
        expect(mine).to_be_visible()
        expect(mine.locator("button.show-all")).to_have_count(0)
