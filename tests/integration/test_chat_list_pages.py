"""The dashboard's chat list, a page at a time: chats newest first, pages that neither overlap nor skip
(a property over any sequence of messages and any page size), and the route that serves it."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.chat.address import ChatAddress
from shared.queue.core import Queue
from shared.reads.conversations import list_conversations
from shared.runtime import Runtime
from tests.web_support import assert_refused

pytestmark = pytest.mark.integration

#: A message: its channel (``chatroom`` is the system's own and never listed) and its chat there.
MESSAGE = st.tuples(st.sampled_from(["telegram", "web", "chatroom"]), st.integers(0, 5))


def all_pages(queue: Queue, limit: int) -> list[list[tuple[str, str]]]:
    pages, before = [], None
    while True:
        page = list_conversations(queue.db, limit=limit, before=before)
        pages.append([(c["channel"], c["conversation"]) for c in page.chats])
        if page.next is None:
            return pages
        before = int(page.next)
        assert len(pages) < 100, "the pages never end"


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(MESSAGE, max_size=25), limit=st.integers(1, 6))
def test_pages_hold_every_chat_once_newest_first(
    queue: Queue, messages: list[tuple[str, int]], limit: int
) -> None:
    with queue.db.transaction() as tx:  # each example starts from an empty queue
        tx.execute("DELETE FROM messages")
    for n, (channel, chat) in enumerate(messages):
        queue.intake.enqueue_message(ChatAddress(channel, f"person {chat}", conversation=f"c{chat}"), f"m{n}")
    # Newest first: the order of each chat's last message, chat rooms left out.
    expected: list[tuple[str, str]] = []
    for channel, chat in reversed(messages):
        key = (channel, f"c{chat}")
        if channel != "chatroom" and key not in expected:
            expected.append(key)

    pages = all_pages(queue, limit)

    assert [chat for page in pages for chat in page] == expected  # no chat twice, none skipped, in order
    assert all(len(page) == limit for page in pages[:-1])  # only the last page is short
    assert len(pages[-1]) <= limit and (len(pages[-1]) > 0 or not expected)


def test_the_route_pages_with_a_link_to_the_next_page_and_answers_as_before_without_parameters(
    api_rt: Runtime, api_client: httpx.Client
) -> None:
    for n in range(5):
        api_rt.queue.intake.enqueue_message(
            ChatAddress("telegram", f"p{n}", conversation=f"chat-{n}"), f"hi {n}"
        )
    whole = api_client.get("/api/conversations")
    assert whole.status_code == 200 and "next" not in whole.links  # one page holds them all: no next page
    assert [c["conversation"] for c in whole.json()] == [f"chat-{n}" for n in (4, 3, 2, 1, 0)]
    assert whole.json()[0]["lastMessage"] == "hi 4" and whole.json()[0]["state"] == "waiting"

    seen: list[str] = []
    url: str | None = "/api/conversations?limit=2"
    while url is not None:
        page = api_client.get(url)
        assert page.status_code == 200, page.text
        assert isinstance(page.json(), list)  # the shape existing clients read: a list of chats
        seen += [c["conversation"] for c in page.json()]
        url = page.links.get("next", {}).get("url")
    assert seen == [f"chat-{n}" for n in (4, 3, 2, 1, 0)]

    assert_refused(api_client.get("/api/conversations?before=yesterday"), 422, "before")
    assert_refused(api_client.get("/api/conversations?limit=0"), 422, "limit")
