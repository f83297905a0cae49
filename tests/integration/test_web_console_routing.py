"""The dashboard's chat box routes as every channel does (issue 24), over a real uvicorn server and SQLite: an
``@agent`` or ``@team`` at the start of the text wins over the agent chosen in the list, an unknown ``@name``
is refused with the names there are and queues nothing, and with no name in the text the chosen agent gets it.
Also: an agent or team id the settings cannot take is refused in words, not with the raw pattern."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.runtime import Runtime
from tests.web_support import LiveServer, home_runtime

pytestmark = pytest.mark.integration

SEND = "/api/conversations/web/messages"


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)  # agents alpha (default), beta, gamma; team dev led by beta


@pytest.fixture
def client(rt: Runtime) -> Iterator[httpx.Client]:
    with LiveServer(rt) as live, live.client() as c:
        yield c


def queued(rt: Runtime) -> list[dict[str, Any]]:
    return rt.db.read("SELECT message, agent, channel, conversation FROM messages ORDER BY id")


@pytest.mark.parametrize(
    ("text", "chosen", "expected"),
    [
        ("@beta hi", "gamma", "beta"),  # the name in the text wins over the list
        ("@Beta: hi", "gamma", "beta"),  # as on every channel: any case, ended by ':' too
        ("@dev hi", "gamma", "beta"),  # a team goes to its leader
        ("hi there", "gamma", "gamma"),  # no name in the text: the agent chosen in the list
        ("mail me at x@beta please", "gamma", "gamma"),  # an @ inside the text addresses nobody
        ("@beta's idea", "gamma", "gamma"),  # not a mention (as the queue reads it)
        ("hi", "dev", "beta"),  # a team chosen in the list
        ("hi", None, "alpha"),  # nothing chosen: the default agent
    ],
)
def test_a_name_in_the_text_wins_over_the_chosen_agent(
    client: httpx.Client, rt: Runtime, text: str, chosen: str | None, expected: str
) -> None:
    r = client.post(SEND, json={"message": text, "agent": chosen, "conversation": "web-r1"})
    assert r.status_code == 201, r.text
    assert r.json()["agent"] == expected
    assert queued(rt) == [{"message": text, "agent": expected, "channel": "web", "conversation": "web-r1"}]


@pytest.mark.parametrize("text", ["@beta hi", "@dev: plan", "plain words", "@nobody hi"])
def test_same_route_as_the_api_without_a_chosen_agent(client: httpx.Client, text: str) -> None:
    """With nothing chosen, the chat box and ``POST /api/message`` (the CLI's and TinyAGI's route) agree."""
    box = client.post(SEND, json={"message": text, "conversation": "web-r2"})
    api = client.post("/api/message", json={"message": text, "conversation": "web-r3"})
    assert box.status_code == api.status_code
    assert box.json().get("agent") == api.json().get("agent")


def test_an_unknown_name_is_refused_with_the_names_there_are(client: httpx.Client, rt: Runtime) -> None:
    r = client.post(SEND, json={"message": "@nobody hi", "agent": "gamma", "conversation": "web-r4"})
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"] == (
        "There is no agent or team called @nobody here, so your message was not sent. "
        "Agents: @alpha, @beta, @gamma. Teams: @dev."
    )
    assert body["unknown"] == "nobody" and body["agents"] == ["alpha", "beta", "gamma"]
    assert queued(rt) == []
    # The reserved "@default" is no unknown name: the message goes where the list says.
    ok = client.post(SEND, json={"message": "@default hi", "agent": "gamma", "conversation": "web-r4"})
    assert ok.status_code == 201 and ok.json()["agent"] == "gamma"


def test_bad_input_is_refused(client: httpx.Client, rt: Runtime) -> None:
    assert client.post(SEND, json={"message": "hi", "conversation": ""}).status_code == 422
    assert client.post(SEND, json={"message": "", "conversation": "web-x"}).status_code == 422
    r = client.post(SEND, json={"message": "hi", "agent": "nosuch", "conversation": "web-x"})
    assert r.status_code == 400 and "nosuch" in r.json()["error"]
    assert queued(rt) == []


RULE = "use lowercase letters, digits, - and _, starting with a letter or digit, at most 32 characters."


@pytest.mark.parametrize(
    ("method", "path", "body", "said"),
    [
        (
            "PUT",
            "/api/settings",
            {"agents": {"Bad Id": {"name": "x"}}},
            "The agent id 'Bad Id' is not allowed",
        ),
        ("PUT", "/api/settings", {"agents": {"-dash": {}}}, "The agent id '-dash' is not allowed"),
        ("PUT", "/api/settings", {"agents": {"a" * 33: {}}}, f"The agent id '{'a' * 33}' is not allowed"),
        (
            "PUT",
            "/api/settings",
            {"teams": {"Crew": {"agents": ["alpha"], "leader": "alpha"}}},
            "The team id 'Crew' is not allowed",
        ),
        ("PUT", "/api/agents/Bad%20Id", {"name": "x"}, "The agent id 'Bad Id' is not allowed"),
        ("PUT", "/api/teams/Crew", {"agents": ["alpha"]}, "The team id 'Crew' is not allowed"),
        ("PUT", "/api/teams/crew", {"agents": ["Alpha"]}, "The agent id 'Alpha' is not allowed"),
    ],
)
def test_a_bad_id_is_refused_in_words(
    client: httpx.Client, rt: Runtime, method: str, path: str, body: dict[str, Any], said: str
) -> None:
    settings = rt.settings.path.read_bytes()
    r = client.request(method, path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error.startswith(said) and error.endswith(RULE), error
    assert "[a-z" not in error and "^" not in error
    assert rt.settings.path.read_bytes() == settings
