"""The real Claude Code CLI (pinned in package.json, ``npm ci``) against the fake Messages API.

Each test runs ``claude -p TEXT --output-format stream-json --verbose`` as a subprocess (argv list, no
shell) in its own workspace and ``HOME``, with every request going to the fake on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.anthropic_api import (
    ApiError,
    Chunked,
    Computed,
    FakeAnthropic,
    RateLimited,
    Text,
    last_user_text,
    user_turns,
)
from tests.fakes.claude_env import claude_binary, claude_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

#: Deadline for one CLI run; a plain run takes about half a second.
RUN_TIMEOUT = 20.0
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@dataclass(frozen=True)
class CliRun:
    """What one CLI run printed: the parsed stream-json lines, stderr, exit code and wall time."""

    returncode: int
    lines: list[dict[str, Any]]
    stderr: str
    wall: float

    def of_type(self, type_: str, subtype: str | None = None) -> list[dict[str, Any]]:
        return [
            line
            for line in self.lines
            if line.get("type") == type_ and (subtype is None or line.get("subtype") == subtype)
        ]

    @property
    def init(self) -> dict[str, Any]:
        (init,) = self.of_type("system", "init")
        return init

    @property
    def result(self) -> dict[str, Any]:
        assert self.lines, f"no output; exit {self.returncode}, stderr: {self.stderr}"
        last = self.lines[-1]
        assert last.get("type") == "result", f"last line is not a result: {last}"
        return last

    @property
    def assistant_text(self) -> str:
        return "".join(
            block.get("text", "")
            for line in self.of_type("assistant")
            for block in line["message"]["content"]
            if block.get("type") == "text"
        )


@dataclass
class Claude:
    """Runs the CLI against ``api`` with one ``HOME`` and one workspace shared by a test's runs."""

    api: FakeAnthropic
    binary: Path
    home: Path
    workspace: Path

    def argv(self, prompt: str, *args: str) -> list[str]:
        return [str(self.binary), *args, "-p", prompt, "--output-format", "stream-json", "--verbose"]

    def env(self, **extra: str) -> dict[str, str]:
        return claude_env(self.api.base_url, self.home, max_retries=2, extra=extra)

    def run(self, prompt: str, *args: str, env: Mapping[str, str] | None = None) -> CliRun:
        started = time.monotonic()
        done = subprocess.run(
            self.argv(prompt, *args),
            cwd=self.workspace,
            env=dict(env) if env is not None else self.env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
        wall = time.monotonic() - started
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        return CliRun(done.returncode, lines, done.stderr, wall)


@pytest.fixture
def api() -> Iterator[FakeAnthropic]:
    with FakeAnthropic() as fake:
        yield fake


@pytest.fixture
def claude(api: FakeAnthropic, tmp_path: Path) -> Claude:
    home = tmp_path / "home"
    workspace = tmp_path / "workspace"
    home.mkdir()
    workspace.mkdir()
    return Claude(api, claude_binary(), home, workspace)


def test_print_run_reports_init_assistant_and_result(claude: Claude, api: FakeAnthropic) -> None:
    rule = api.add_rule("say hello", Text("Hello from the fake"))

    run = claude.run("please say hello")

    assert run.returncode == 0, run.stderr
    session_id = run.init["session_id"]
    assert UUID_RE.match(session_id)
    assert run.lines[0] is run.init
    assert run.assistant_text == "Hello from the fake"
    result = run.result
    assert result["subtype"] == "success"
    assert result["is_error"] is False
    assert result["result"] == "Hello from the fake"
    assert result["session_id"] == session_id
    assert result["num_turns"] == 1
    assert rule.hits == 1
    (main,) = api.main_requests()
    assert main.path == "/v1/messages"
    assert "beta=true" in main.query
    assert main.body["stream"] is True
    assert main.headers["x-api-key"] == "test"
    assert main.last_user_text == "please say hello"
    assert main.user_turns == 1
    # The first user message starts with a <system-reminder> block before the prompt.
    first_content = main.body["messages"][0]["content"]
    assert "<system-reminder>" in first_content[0]["text"]
    # Offline: the main call is the only request that reached anything (no /api/hello warm-up either).
    assert [request.kind for request in api.requests] == ["main"]
    assert run.wall < RUN_TIMEOUT


def test_chunked_reply_streams_deltas_in_order_with_the_interval(claude: Claude, api: FakeAnthropic) -> None:
    api.add_rule(None, Chunked(["one ", "two ", "three"], interval=0.4))

    run = claude.run("count", "--include-partial-messages")

    assert run.returncode == 0, run.stderr
    deltas = [
        line["event"]["delta"]["text"]
        for line in run.of_type("stream_event")
        if line["event"]["type"] == "content_block_delta"
    ]
    assert deltas == ["one ", "two ", "three"]
    assert run.result["result"] == "one two three"
    assert run.wall >= 0.8


def test_continue_sends_the_earlier_turns(claude: Claude, api: FakeAnthropic) -> None:
    api.add_rule(None, Computed(lambda body: f"answer {user_turns(body)} to {last_user_text(body)}"))

    first = claude.run("first question")
    second = claude.run("second question", "-c")

    assert first.result["result"] == "answer 1 to first question"
    assert second.returncode == 0, second.stderr
    assert second.result["result"] == "answer 2 to second question"
    earlier, later = api.main_requests()
    assert earlier.user_turns == 1
    assert later.user_turns == 2
    turns = [
        (message["role"], block["text"])
        for message in later.body["messages"]
        if message["role"] in ("user", "assistant") and isinstance(message["content"], list)
        for block in message["content"]
        if block.get("type") == "text" and "<system-reminder>" not in block["text"]
    ]
    assert turns == [
        ("user", "first question"),
        ("assistant", "answer 1 to first question"),
        ("user", "second question"),
    ]


def test_resume_continues_the_named_session_not_the_latest(claude: Claude, api: FakeAnthropic) -> None:
    api.add_rule(None, Computed(lambda body: f"seen {user_turns(body)}"))

    alpha = claude.run("alpha")
    beta = claude.run("beta")
    assert alpha.init["session_id"] != beta.init["session_id"]

    resumed = claude.run("gamma", "--resume", alpha.init["session_id"])

    assert resumed.returncode == 0, resumed.stderr
    assert resumed.result["result"] == "seen 2"
    last = api.main_requests()[-1]
    body_text = json.dumps(last.body["messages"])
    assert "alpha" in body_text
    assert "beta" not in body_text
    assert last.last_user_text == "gamma"


def test_api_error_400_ends_the_run_at_once(claude: Claude, api: FakeAnthropic) -> None:
    api.add_rule("break", ApiError("scripted failure"))

    run = claude.run("please break")

    assert run.returncode != 0
    result = run.result
    assert result["is_error"] is True
    assert result.get("terminal_reason") == "api_error"
    assert "scripted failure" in result["result"]
    assert not run.of_type("system", "api_retry")
    # No visible retries, but the CLI resends at once with experimental betas stripped one by one
    # (6 requests on 2.1.332; 1 with CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS=1), all refused here.
    statuses = [request.status for request in api.main_requests()]
    assert 1 <= len(statuses) <= 6
    assert set(statuses) == {400}
    assert run.wall < 10


def test_rate_limit_429_is_retried_by_the_cli(claude: Claude, api: FakeAnthropic) -> None:
    api.add_rule(None, RateLimited(retry_after=1), times=1)
    api.add_rule(None, Text("after the limit"))

    run = claude.run("hello")

    assert run.returncode == 0, run.stderr
    (retry,) = run.of_type("system", "api_retry")
    assert retry["error_status"] == 429
    assert retry["retry_delay_ms"] >= 1000  # retry-after is honoured as a lower bound
    assert run.result["result"] == "after the limit"
    assert [request.status for request in api.main_requests()] == [429, 200]


def test_server_errors_are_retried_up_to_the_limit(claude: Claude, api: FakeAnthropic) -> None:
    api.add_rule(None, ApiError("boom", status=500, error_type="api_error"))

    run = claude.run("hello", env=claude_env(api.base_url, claude.home, max_retries=1))

    assert run.returncode != 0
    assert len(run.of_type("system", "api_retry")) == 1
    assert run.result["is_error"] is True
    assert run.result.get("api_error_status") == 500
    assert len(api.main_requests()) == 2


def test_x_should_retry_false_stops_retries(claude: Claude, api: FakeAnthropic) -> None:
    api.add_rule(None, RateLimited(retry_after=30, should_retry=False))

    run = claude.run("hello")

    assert run.returncode != 0
    assert run.result["is_error"] is True
    assert "429" in run.result["result"]
    assert len(api.main_requests()) == 1
    assert run.wall < 10


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="checks the root-only refusal")
def test_root_skip_permissions_needs_is_sandbox(claude: Claude, api: FakeAnthropic) -> None:
    api.add_rule(None, Text("sandboxed"))
    without_sandbox = claude.env()
    del without_sandbox["IS_SANDBOX"]

    refused = claude.run("hi", "--dangerously-skip-permissions", env=without_sandbox)

    assert refused.returncode != 0
    assert "root/sudo" in refused.stderr
    assert api.main_requests() == []

    allowed = claude.run("hi", "--dangerously-skip-permissions")

    assert allowed.returncode == 0, allowed.stderr
    assert allowed.init["permissionMode"] == "bypassPermissions"
    assert allowed.result["result"] == "sandboxed"
    assert len(api.main_requests()) == 1


def test_slow_silent_reply_can_be_interrupted(claude: Claude, api: FakeAnthropic) -> None:
    api.add_rule(None, Text("too late", delay=60))

    with subprocess.Popen(
        claude.argv("wait for it"),
        cwd=claude.workspace,
        env=claude.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as process:
        try:
            api.wait_for_main_requests(1, timeout=RUN_TIMEOUT)
            assert process.poll() is None, "the CLI should still wait for the reply"
            process.terminate()
            process.wait(timeout=10)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        output = process.stdout.read() if process.stdout else ""

    assert process.returncode != 0
    assert "too late" not in output


def test_fake_answers_the_other_endpoints(api: FakeAnthropic) -> None:
    def post(path: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(
            api.base_url + path,
            data=json.dumps(payload).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())

    api.add_rule("ping", Text("pong"))
    main_body = {"model": "m", "tools": [{"name": "t"}], "messages": [{"role": "user", "content": "ping"}]}
    side_body = {"model": "m", "messages": [{"role": "user", "content": "ping"}]}

    status, message = post("/v1/messages", main_body)
    assert (status, message["content"]) == (200, [{"type": "text", "text": "pong"}])
    status, side = post("/v1/messages", side_body)
    assert (status, side["content"][0]["text"]) == (200, "OK")
    status, counted = post("/v1/messages/count_tokens", side_body)
    assert status == 200
    assert counted["input_tokens"] > 0
    assert post("/anything/else", {}) == (200, {})
    with urllib.request.urlopen(api.base_url + "/v1/models", timeout=5) as response:
        assert json.loads(response.read()) == {}
    assert [request.kind for request in api.requests] == ["main", "side", "count_tokens", "other", "other"]


def test_computed_reply_that_raises_answers_a_final_500(api: FakeAnthropic) -> None:
    def explode(body: dict[str, Any]) -> str:
        raise ValueError("bad script")

    api.add_rule(None, Computed(explode))
    body = {"model": "m", "tools": [{"name": "t"}], "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        api.base_url + "/v1/messages", data=json.dumps(body).encode(), method="POST"
    )

    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=5)

    with raised.value as response:
        assert response.code == 500
        assert response.headers["x-should-retry"] == "false"
        assert "bad script" in json.loads(response.read())["error"]["message"]
    assert [type(error) for error in api.errors] == [ValueError]
