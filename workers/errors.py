"""What kind of failure a run ended in, and how to say it to the person who is waiting.

- *permanent*: it cannot succeed on a retry (the API refused the request, the login is missing or invalid,
  the CLI is missing or refuses to start, the model does not exist, one of the agent's limits stopped it —
  the same request runs into the same wall): the message fails at once, with one explanation — no retries
  burnt while the user watches "typing".
- *transient*: it may well succeed next time (5xx, a timeout, the network, a crash): backoff retries.
- *rate limit*: this account's usage or rate limit (HTTP 429, "usage limit reached"); and *overloaded*: the AI
  service's servers are overloaded (HTTP 529), which is nobody's limit. Both are handled apart — a pause or
  the fallback model, no attempt counted (:mod:`workers.ratelimit`) — but never told in each other's words.

The explanation and advice are for a chat user: plain words, no error codes without words around them.
:func:`api_retry_notice` words the note a chat gets while the CLI itself retries a failed API call.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from workers.providers.base import RunResult

ErrorKind = Literal["permanent", "transient", "rate_limit", "overloaded"]

_OPERATOR_THEN_RETRY = "The operator of this bot needs to fix that on the server; then type /retry."

#: Error texts of a connection that never reached the AI service (node's codes and the CLI's words).
_UNREACHABLE = re.compile(
    r"ECONNREFUSED|ECONNRESET|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|EHOSTUNREACH|ENETUNREACH|connection refused|"
    r"unable to connect|fetch failed|network error|socket hang up|getaddrinfo",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Diagnosis:
    """A failed run, judged: its kind, what happened and what the user can do (both in a user's words)."""

    kind: ErrorKind
    explanation: str
    advice: str = ""

    @property
    def permanent(self) -> bool:
        return self.kind == "permanent"

    @property
    def pauses_agent(self) -> bool:
        """Whether the agent waits (or moves to its fallback model) instead of counting a failed attempt."""
        return self.kind in ("rate_limit", "overloaded")


def servers(service: str) -> str:
    """``Anthropic's servers`` (``the AI service's servers`` when the service is unknown)."""
    return f"{service}'s servers" if service else "the AI service's servers"


def _api(service: str) -> str:
    return f"{service}'s API" if service else "the AI service"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _api_detail(error: str) -> str:
    """The API's own short reason, when it is readable text (``"prompt is too long"``), else ''."""
    match = re.search(r'"message"\s*:\s*"([^"]{3,160})"', error)
    if match:
        return match.group(1)
    # "claude reported an error (api_error): API Error: 400 <reason>. More words…" -> "<reason>"
    text = re.sub(r"^\w+ (?:reported an error \([^)]*\)|turn failed|error): ", "", error.strip())
    text = re.sub(r"^.*?API Error: (?:\d{3} )?", "", text)
    text = re.split(r" · |\. ", text, maxsplit=1)[0].strip().rstrip(".")
    return text if 3 <= len(text) <= 160 and "{" not in text else ""


def api_retry_notice(
    service: str, *, status: int | None, error: str, attempt: int, max_retries: int, delay_ms: int
) -> str:
    """The note a chat gets while the agent's CLI retries a failed API call inside its run.

    ``error`` is the CLI's own word for the cause (Claude Code's ``api_retry`` line: ``overloaded``,
    ``rate_limit``, ``server_error``, ``authentication_failed``, ``unknown``); ``attempt`` counts the
    retries (1 = the first retry) of at most ``max_retries``.
    """
    if error == "overloaded" or status == 529:
        what = f"{servers(service)} are overloaded (this is not a usage limit)"
    elif error == "rate_limit" or status == 429:
        what = f"{_api(service)} is rate-limiting this agent's requests"
    elif error == "authentication_failed" or status in (401, 403):
        what = f"{_api(service)} did not accept this agent's login"
    elif status is None:
        what = f"the agent cannot reach {_api(service)} right now"
    else:
        what = f"{servers(service)} had a temporary problem (error {status})"
    seconds = max(1, math.ceil(delay_ms / 1000))
    of = f" of {max_retries}" if max_retries > 0 else ""
    return f"{_capital(what)} — trying again in {seconds} s (retry {attempt}{of})…"


def diagnose(result: RunResult) -> Diagnosis:
    """Classify a failed run (see the module docstring)."""
    error = result.error or ""
    lowered = error.lower()
    status = result.status
    if result.limit is not None:
        return Diagnosis("permanent", result.limit.explanation, result.limit.advice)
    if result.overloaded:
        return Diagnosis(
            "overloaded", f"{servers(result.service)} are overloaded (this is not a usage limit)"
        )
    if result.rate_limited:
        return Diagnosis("rate_limit", "the AI service's usage or rate limit was reached")
    if "root/sudo" in lowered or "cannot be used with root" in lowered:
        return Diagnosis(
            "permanent",
            "the server runs the agent as the root user with permission checks switched off, "
            "which Claude Code refuses to do",
            "The operator can run agentpost as a normal user, or set IS_SANDBOX=1 if the machine is a "
            "sandbox; then type /retry.",
        )
    if status == 403 or "permission_error" in lowered:
        detail = _api_detail(error)
        said = f" (it said: “{detail}”)" if detail else ""
        return Diagnosis(
            "permanent",
            f"the AI service does not allow the agent's account or key to do this{said}",
            _OPERATOR_THEN_RETRY,
        )
    if (
        status == 401
        or "not logged in" in lowered
        or "invalid api key" in lowered
        or "/login" in lowered
        or "authentication_error" in lowered
        or "oauth token" in lowered
    ):
        return Diagnosis(
            "permanent",
            "the agent is not logged in to its AI service on the server (or its key is no longer valid)",
            _OPERATOR_THEN_RETRY,
        )
    if result.cannot_start or lowered.startswith("cannot start ") or "was not found" in lowered:
        return Diagnosis(
            "permanent",
            "the agent's program could not be started on the server",
            "The operator can run `agentpost doctor` to see why; then type /retry.",
        )
    if status == 404 or ("model" in lowered and ("not_found" in lowered or "not found" in lowered)):
        return Diagnosis(
            "permanent",
            "the AI model this agent is set to use is not available",
            "The operator needs to change the agent's model setting; then type /retry.",
        )
    if status is not None and 400 <= status < 500 and status not in (408, 409, 429):
        detail = _api_detail(error)
        said = f" (it said: “{detail}”)" if detail else ""
        return Diagnosis("permanent", f"the AI service refused this request{said}")
    if result.timed_out:
        if result.stopped_by == "idle":
            return Diagnosis("transient", "the agent stopped responding")
        return Diagnosis("transient", "it took longer than this agent's time limit")
    if status == 408:
        return Diagnosis("transient", "the AI service took too long to answer")
    if status is not None and (status >= 500 or status == 409):
        return Diagnosis("transient", "the AI service had a temporary problem")
    if status is None and _UNREACHABLE.search(error):
        return Diagnosis(
            "transient", "the agent could not reach its AI service (a network problem on the server)"
        )
    return Diagnosis("transient", "the agent's program stopped with an error")
