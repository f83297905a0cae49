"""The dashboard in headless Chromium (Debian's chromium driven by Playwright): it loads, a message typed into
the chat box reaches the queue, the processed reply appears (the test plays the processor through the real
queue API), and a dead letter is retried with its button."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

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

pytestmark = pytest.mark.e2e


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)


def test_dashboard_chat_reply_and_dead_letter_retry(rt: Runtime) -> None:
    need_chromium()
    from playwright.sync_api import expect, sync_playwright

    doomed = rt.queue.intake.enqueue_message(
        ChatAddress("api", "ops"), "this one keeps failing", agent="beta"
    ).message_id
    assert kill_until_dead(rt.queue, "beta") == [doomed]

    with LiveServer(rt) as live, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            sign_in(page, live.url)

            # The dashboard loads: the live stream connected, the agents, the dead letter listed.
            expect(page).to_have_title("agentpost")
            expect(page.locator("#conn")).to_have_text("live")
            expect(page.locator("#st-dead")).to_have_text("1")
            page.click(".tab[data-view='agents']")
            expect(page.locator("#agents-table tr[data-agent='alpha']")).to_be_visible()
            page.click(".tab[data-view='ops']")
            expect(page.locator(f"#dead-list li[data-id='{doomed}']")).to_be_visible()
            page.click(".tab[data-view='chat']")

            # A message typed into the chat box reaches the queue on the web channel.
            page.fill("#chat-input", "hello from the browser")
            page.click("#chat-send")
            queued = wait_until(
                lambda: rt.db.read("SELECT * FROM messages WHERE message = 'hello from the browser'"),
                10,
                "the chat message in the queue",
            )
            row = queued[0]
            assert row["channel"] == "web" and row["agent"] == "alpha" and row["status"] == "pending"
            assert row["conversation"].startswith("web-")
            expect(page.locator(f".chat-mine[data-id='{row['message_id']}']")).to_contain_text("waiting")
            expect(page.locator("#st-pending")).to_have_text("1")

            # The processor's part, played with the real queue API; the reply shows up in the chat.
            assert play_processor(rt.queue, "alpha", lambda m: f"pong: {m.message}") == [row["message_id"]]
            reply = page.locator(".chat-reply", has_text="pong: hello from the browser")
            expect(reply).to_be_visible()
            wait_until(
                lambda: (
                    rt.db.read_scalar(
                        "SELECT status FROM responses WHERE message_id = :m", {"m": row["message_id"]}
                    )
                    == "acked"
                ),
                10,
                "the reply to be acked once shown",
            )
            expect(page.locator("#event-feed li", has_text="response_ready")).to_have_count(1)

            # The dead letter is retried with its button.
            page.click(".tab[data-view='ops']")
            page.click(f"#dead-list button.retry[data-id='{doomed}']")
            wait_until(
                lambda: (m := rt.queue.admin.get_message(doomed)) is not None and m.status == "pending",
                10,
                "the dead letter back to pending",
            )
            expect(page.locator(f"#dead-list li[data-id='{doomed}']")).to_have_count(0)
            expect(page.locator("#st-dead")).to_have_text("0")
            message = rt.queue.admin.get_message(doomed)
            assert message is not None and message.manual_retries == 1
            assert errors == []
        finally:
            browser.close()
