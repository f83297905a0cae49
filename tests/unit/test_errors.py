"""The failure classifier (:mod:`workers.errors`) on what the pinned claude CLI really prints for each kind of
failure — fixtures captured from it against the fake API by ``tests/fixtures/cli_errors/capture.py`` — read
through the claude provider exactly as a run reads it; and the notices a chat gets while the CLI retries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from shared.settings.model import AgentSettings
from workers.errors import ErrorKind, api_retry_notice, diagnose
from workers.providers.base import RunRequest, RunResult, StreamState
from workers.providers.claude import ClaudeProvider
from workers.providers.cli_output import looks_overloaded, looks_rate_limited

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cli_errors"


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def replay(name: str) -> tuple[RunResult, list[str], list[str]]:
    """A captured run read by the claude provider: its result, the progress texts and the chat notices."""
    captured = fixture(name)
    provider = ClaudeProvider()
    state = StreamState()
    progress: list[str] = []
    notices: list[str] = []
    for line in captured["stdout"]:
        progress += provider.parse_line(line, state)
        notices += state.notices
        state.notices.clear()
    result = provider.finish(state, captured["exit_code"], captured["stderr"])
    result.service = provider.service  # what CliProvider.run adds to every result
    return result, progress, notices


#: Each captured kind: what the user must be told (the kind, and words the explanation must hold).
EXPECTED: dict[str, tuple[ErrorKind, str]] = {
    "400": ("permanent", "refused this request (it said: “messages.0.content: text content blocks must be non-empty”)"),
    "400_prompt_too_long": ("permanent", "refused this request (it said: “Prompt is too long”)"),
    "401": ("permanent", "not logged in to its AI service"),
    "403": ("permanent", "does not allow the agent's account or key to do this"),
    "404_model": ("permanent", "model this agent is set to use is not available"),
    "408": ("transient", "took too long to answer"),
    "409": ("transient", "had a temporary problem"),
    "413": ("permanent", "refused this request (it said: “Request too large (max 32MB)”)"),
    "429": ("rate_limit", "usage or rate limit"),
    "500": ("transient", "had a temporary problem"),
    "529": ("overloaded", "Anthropic's servers are overloaded (this is not a usage limit)"),
    "connection_refused": ("transient", "could not reach its AI service"),
    "root_bypass": ("permanent", "root user with permission checks switched off"),
}  # fmt: skip


def test_every_captured_kind_is_expected_here_and_comes_from_one_cli_version() -> None:
    captured = {path.stem for path in FIXTURES.glob("*.json")}
    assert captured == set(EXPECTED)
    assert len({fixture(name)["cli_version"] for name in captured}) == 1


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_real_cli_output_of_each_failure_is_classified_in_plain_words(name: str) -> None:
    kind, words = EXPECTED[name]
    result, progress, _ = replay(name)
    assert not result.ok and result.exit_code == fixture(name)["exit_code"] != 0
    assert progress == []  # the CLI's synthetic error message is never shown as the agent's work
    diagnosis = diagnose(result)
    assert (diagnosis.kind, words in diagnosis.explanation) == (kind, True), diagnosis
    assert diagnosis.pauses_agent == (kind in ("rate_limit", "overloaded"))
    assert "{" not in diagnosis.explanation and "API Error" not in diagnosis.explanation
    if kind == "permanent":
        assert diagnosis.advice or "refused this request" in diagnosis.explanation


def test_overloaded_is_never_called_a_usage_limit_nor_a_limit_an_overload() -> None:
    overloaded, _, _ = replay("529")
    limited, _, _ = replay("429")
    assert (overloaded.overloaded, overloaded.rate_limited, overloaded.status) == (True, False, 529)
    assert (limited.overloaded, limited.rate_limited, limited.status) == (False, True, 429)
    assert "usage or rate limit" not in diagnose(overloaded).explanation
    assert "overloaded" not in diagnose(limited).explanation
    assert looks_overloaded("API Error: Repeated 529 Overloaded errors") and not looks_rate_limited(
        "Overloaded"
    )
    assert looks_rate_limited("Claude AI usage limit reached|1760000000") and not looks_overloaded("429")


def test_the_clis_retries_become_notices_from_the_second_retry_on() -> None:
    # The first retry comes after about half a second and usually works: a chat is told from the second.
    _, _, overloaded = replay("529")
    _, _, limited = replay("429")
    assert len(overloaded) == 1 and len(limited) == 1
    assert overloaded[0].startswith(
        "Anthropic's servers are overloaded (this is not a usage limit) — trying again"
    )
    assert "(retry 2 of 2)" in overloaded[0] and "usage limit" not in limited[0]
    assert limited[0].startswith("Anthropic's API is rate-limiting this agent's requests — trying again in ")
    for one_retry in ("401", "408", "409", "500", "connection_refused"):
        assert replay(one_retry)[2] == [], one_retry  # a single quick retry is a blip, not news


def test_retry_notices_name_the_cause_in_plain_words() -> None:
    def notice(status: int | None, error: str, delay_ms: int = 4000) -> str:
        return api_retry_notice(
            "Anthropic", status=status, error=error, attempt=3, max_retries=10, delay_ms=delay_ms
        )

    assert notice(529, "overloaded") == (
        "Anthropic's servers are overloaded (this is not a usage limit) — trying again in 4 s (retry 3 of 10)…"
    )
    assert notice(401, "authentication_failed").startswith(
        "Anthropic's API did not accept this agent's login"
    )
    assert notice(None, "unknown").startswith("The agent cannot reach Anthropic's API right now")
    assert notice(500, "server_error", 1).startswith(
        "Anthropic's servers had a temporary problem (error 500)"
    )
    assert "trying again in 1 s" in notice(500, "server_error", 1)
    generic = api_retry_notice("", status=529, error="", attempt=1, max_retries=0, delay_ms=5000)
    assert (
        generic
        == "The AI service's servers are overloaded (this is not a usage limit) — trying again in 5 s (retry 1)…"
    )


@pytest.mark.parametrize("guarded", [True, False], ids=["orphan-guard", "direct"])
@pytest.mark.parametrize("missing", ["no such file", "bad interpreter"])
def test_a_missing_cli_is_a_permanent_failure_that_names_doctor(
    tmp_path: Path, missing: str, guarded: bool
) -> None:
    if missing == "no such file":
        command = str(tmp_path / "nowhere" / "claude")
    else:
        # The npm package's launcher when its interpreter is gone: exec itself fails.
        script = tmp_path / "claude"
        script.write_text("#!/nonexistent/node\n")
        script.chmod(0o755)
        command = str(script)
    request = RunRequest(
        agent="coder",
        settings=AgentSettings(provider="claude", command=[command]),
        workspace=tmp_path / "ws",
        prompt="hi",
        env={"PATH": "/usr/bin:/bin"},
        orphan_guard=guarded,
    )

    async def no_progress(text: str) -> None:
        raise AssertionError(text)

    result = anyio.run(ClaudeProvider().run, request, no_progress)
    assert not result.ok and result.cannot_start, result
    diagnosis = diagnose(result)
    assert diagnosis.kind == "permanent" and "could not be started" in diagnosis.explanation
    assert "agentpost doctor" in diagnosis.advice
