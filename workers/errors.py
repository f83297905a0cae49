"""What kind of failure a run ended in, and how to say it to the person who is waiting.

- *permanent*: it cannot succeed on a retry (the API refused the request, the login is missing or invalid,
  the CLI is missing or refuses to start, the model does not exist): the message fails at once, with one
  explanation — no retries burnt while the user watches "typing".
- *transient*: it may well succeed next time (5xx, network, timeout, crash): backoff retries.
- *rate limit*: handled apart (a pause or the fallback model, no attempt counted; :mod:`workers.ratelimit`).

The explanation and advice are for a chat user: plain words, no error codes without words around them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from workers.providers import RunResult

ErrorKind = Literal["permanent", "transient", "rate_limit"]

_OPERATOR_THEN_RETRY = "The operator of this bot needs to fix that on the server; then type /retry."


@dataclass(frozen=True)
class Diagnosis:
    """A failed run, judged: its kind, what happened and what the user can do (both in a user's words)."""

    kind: ErrorKind
    explanation: str
    advice: str = ""

    @property
    def permanent(self) -> bool:
        return self.kind == "permanent"


def _api_detail(error: str) -> str:
    """The API's own short reason, when it is readable text (``"prompt is too long"``), else ''."""
    match = re.search(r'"message"\s*:\s*"([^"]{3,160})"', error)
    if match:
        return match.group(1)
    tail = error.rsplit(":", 1)[-1].strip()
    return tail if 3 <= len(tail) <= 160 and "{" not in tail else ""


def diagnose(result: RunResult) -> Diagnosis:
    """Classify a failed run (see the module docstring)."""
    error = result.error or ""
    lowered = error.lower()
    status = result.status
    if result.rate_limited:
        return Diagnosis("rate_limit", "the AI service's usage limit was reached")
    if "root/sudo" in lowered or "cannot be used with root" in lowered:
        return Diagnosis(
            "permanent",
            "the server runs the agent as the root user with permission checks switched off, "
            "which Claude Code refuses to do",
            "The operator can run agentpost as a normal user, or set IS_SANDBOX=1 if the machine is a "
            "sandbox; then type /retry.",
        )
    if (
        status in (401, 403)
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
    if status is not None and status >= 500:
        return Diagnosis("transient", "the AI service had a temporary problem")
    return Diagnosis("transient", "the agent's program stopped with an error")
