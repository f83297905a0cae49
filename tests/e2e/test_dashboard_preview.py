"""The dashboard shows a reply growing while it is written (``message:preview`` on the event stream), in
headless Chromium over a real server and SQLite. The test plays the processor with the real queue API and
the processor's own preview writer (workers/previews.py); the preview goes once the final reply is there."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.queue.records import ResponseDraft
from shared.runtime import Runtime
from shared.storage.db import Tx
from tests.e2e.test_dashboard_details import dashboard, send, web_rows
from tests.web_support import home_runtime, wait_until
from workers.previews import PreviewWriter

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)


def test_the_open_chat_shows_the_reply_growing_then_the_reply(rt: Runtime) -> None:
    from playwright.sync_api import expect

    with dashboard(rt) as (_, page, _console):
        send(page, "tell me slowly")
        wait_until(lambda: web_rows(rt), 10, "the message queued")
        (claimed,) = rt.queue.messages.claim_all_pending_messages("alpha", "test-processor")
        chat = ChatAddress("web", "web", conversation=claimed.conversation)
        writer = PreviewWriter(rt.db, chat, "run-1", [claimed.message_id])
        rt.db.run_transaction(writer.work("Line 1 of the answer"))
        writing = page.locator(".chat-writing")
        expect(writing).to_contain_text("Line 1 of the answer")
        rt.db.run_transaction(writer.work("Line 1 of the answer\nLine 2 of the answer"))
        expect(writing).to_contain_text("Line 2 of the answer")
        expect(writing).to_have_count(1)  # one growing bubble, not one per preview
        writer.written = True

        def final_with(tx: Tx) -> None:
            writer.clear_in(tx)

        rt.queue.messages.complete_messages(
            [claimed.message_id],
            "test-processor",
            ResponseDraft(
                "Line 1 of the answer\nLine 2 of the answer\nThe end.",
                metadata={"kind": "final", "edit_key": "run-1"},
            ),
            also=final_with,
        )
        expect(page.locator(".chat-reply", has_text="The end.")).to_have_count(1)
        expect(writing).to_have_count(0)
