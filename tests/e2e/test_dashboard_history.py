"""The dashboard's chat history in headless Chromium over a real server (the test stands in for the processor
through the real queue API): a long chat is paged with "Show older messages" without losing messages written
in the same millisecond, and a reply's Markdown never turns its text into markup or script."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.e2e.test_dashboard_console import _need_chromium
from tests.web_support import CHROMIUM, CHROMIUM_ARGS, LiveServer, home_runtime, play_processor, sign_in

pytestmark = pytest.mark.e2e

HOSTILE = (
    "Look: <img src=x onerror=\"document.title='pwned'\"> and <script>document.title='pwned'</script>\n\n"
    "[click](javascript:document.title='pwned') [docs](https://example.org/a?b=1&c=2)\n\n"
    "- one `<b>`\n- two **bold**\n\n```html\n<i>as text</i>\n```"
)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)


def test_long_history_is_paged_and_markdown_is_inert(rt: Runtime) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    for n in range(1, 71):
        rt.queue.intake.enqueue_message(
            ChatAddress("web", "web", conversation="web-long"), f"note number {n}", agent="beta"
        )
    rt.queue.intake.enqueue_message(
        ChatAddress("web", "web", conversation="web-long"), "show me something", agent="alpha"
    )
    play_processor(rt.queue, "alpha", lambda m: HOSTILE)

    with LiveServer(rt) as live, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            sign_in(page, live.url)
            page.locator("#conv-list .conv[data-conversation='web-long']").click()
            expect(page.locator("#chat-title")).to_have_text("Web chat")

            reply = page.locator(".chat-reply").last
            expect(reply).to_contain_text("Look:")
            expect(reply.locator("img, script, i")).to_have_count(0)
            expect(reply.locator("a")).to_have_count(1)
            expect(reply.locator("a")).to_have_attribute("href", "https://example.org/a?b=1&c=2")
            expect(reply.locator("li")).to_have_count(2)
            expect(reply.locator("li code")).to_have_text("<b>")
            expect(reply.locator("strong")).to_have_text("bold")
            expect(reply.locator("pre code")).to_have_text("<i>as text</i>")
            expect(page).to_have_title("agentpost")

            # 72 items (70 notes, the question, the reply): the newest 50 first, then the rest on demand.
            expect(page.locator("#chat-log .chat-msg")).to_have_count(50)
            expect(page.locator(".chat-mine", has_text="note number 23")).to_have_count(1)
            expect(page.locator(".chat-mine", has_text="note number 22")).to_have_count(0)
            page.click("#chat-older")
            expect(page.locator("#chat-log .chat-msg")).to_have_count(72)
            expect(page.locator("#chat-older")).to_be_hidden()
            texts = page.locator(".chat-mine .md").all_inner_texts()
            assert texts[:70] == [f"note number {n}" for n in range(1, 71)]
            assert errors == []
        finally:
            browser.close()


def test_the_chat_list_loads_older_chats_as_it_is_scrolled(rt: Runtime) -> None:
    _need_chromium()
    from playwright.sync_api import expect, sync_playwright

    for n in range(120):  # more than two pages of 50
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", f"person {n}", conversation=f"tg-{n}"), f"hello {n}"
        )

    with LiveServer(rt) as live, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            sign_in(page, live.url)
            chats = page.locator("#conv-list .conv[data-channel='telegram']")
            expect(chats).to_have_count(50)  # the first page, newest first
            expect(chats.first).to_have_attribute("data-conversation", "tg-119")
            page.locator("#conv-list").evaluate("list => { list.scrollTop = list.scrollHeight; }")
            expect(chats).to_have_count(100)  # scrolled to its end: the next page, after the first
            expect(chats.nth(50)).to_have_attribute("data-conversation", "tg-69")
            # Scrolled to its end again: the last page (the "more" button is drawn anew by the list's
            # refreshes, so a click on it races them; scrolling is what a person does anyway).
            page.locator("#conv-list").evaluate("list => { list.scrollTop = list.scrollHeight; }")
            expect(chats).to_have_count(120)
            expect(chats.last).to_have_attribute("data-conversation", "tg-0")
            expect(page.locator("#conv-list .conv-more")).to_have_count(0)  # the last page: nothing more
            assert len({chats.nth(i).get_attribute("data-conversation") for i in range(120)}) == 120
            assert not errors, errors
        finally:
            browser.close()
