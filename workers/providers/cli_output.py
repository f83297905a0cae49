"""Reading a CLI's output: the helpers the providers share to parse JSON lines and to recognise a usage or
rate limit, or an overloaded service, in an error text."""

from __future__ import annotations

import json
import re
from typing import Any


def json_line(line: str) -> dict[str, Any] | None:
    """A line of JSON-lines output as an object; None for anything else (a blank or non-JSON line)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


_RATE_LIMIT_WORDS = (
    "usage limit",
    "rate limit",
    "rate_limit",
    "hit your limit",
    "limit reached",
)


def looks_rate_limited(text: str) -> bool:
    """Whether an error text reports a usage or rate limit of this account (not the agent's fault)."""
    lowered = text.lower()
    return bool(re.search(r"\b429\b", lowered)) or any(word in lowered for word in _RATE_LIMIT_WORDS)


def looks_overloaded(text: str) -> bool:
    """Whether an error text reports the AI service's servers overloaded (HTTP 529): nobody's limit."""
    lowered = text.lower()
    return bool(re.search(r"\b529\b", lowered)) or "overloaded" in lowered
