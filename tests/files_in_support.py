"""Helpers for the "files in" tests: a small real PNG, and a scripted model that reads the files a message
names with the Claude CLI's ``Read`` tool and then says what it got (see ``tests/fakes/anthropic_api.py``).
"""

from __future__ import annotations

import base64
import re
import struct
import zlib
from typing import Any

from tests.fakes.anthropic_api import JSON, Reply, ToolUse, last_user_text, tool_result_text

_FILE_RE = re.compile(r"\[file: ([^\]\n]+)\]")
_REMINDER_RE = re.compile(r"<system-reminder>.*?</system-reminder>", re.DOTALL)

#: A text document a user sends.
DOC = b"Meeting notes\nThe launch word is PELICAN-7.\n"


def png(width: int = 3, height: int = 2) -> bytes:
    """A small, valid PNG (8-bit RGB, a red-green gradient), built by hand."""
    rows = b"".join(
        b"\x00"
        + b"".join(
            bytes((255 * x // max(1, width - 1), 255 * y // max(1, height - 1), 0)) for x in range(width)
        )
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


PNG = png()
PNG_B64 = base64.b64encode(PNG).decode()


def all_tool_results(body: JSON, *, this_turn: bool = False) -> list[JSON]:
    """Every ``tool_result`` block of a request, oldest first (the CLI resends the conversation each time);
    with ``this_turn`` only those after the user's last typed text (a resumed session carries older ones)."""
    found: list[JSON] = []
    for message in body.get("messages") or []:
        if not (isinstance(message, dict) and message.get("role") == "user"):
            continue
        content = message.get("content")
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        typed = isinstance(content, str) or any(
            b.get("type") == "text" and _REMINDER_RE.sub("", str(b.get("text", ""))).strip() for b in blocks
        )
        if this_turn and typed and not any(b.get("type") == "tool_result" for b in blocks):
            found = []
        found.extend(b for b in blocks if b.get("type") == "tool_result")
    return found


def typed_texts(body: JSON) -> str:
    """Every text block of the user's last typed message, joined: with an image the CLI adds a text block
    of its own after the prompt's (``[Image: source: …]``), so the prompt is not always the last one."""
    for message in reversed(body.get("messages") or []):
        if not (isinstance(message, dict) and message.get("role") == "user"):
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [
            str(b.get("text", "")) for b in content or [] if isinstance(b, dict) and b.get("type") == "text"
        ]
        if any(_REMINDER_RE.sub("", t).strip() for t in texts):
            return "\n".join(_REMINDER_RE.sub("", t) for t in texts)
    return last_user_text(body)


def reader(body: JSON) -> str | Reply:
    """The scripted model: ``Read`` each ``[file: …]`` of the prompt in turn, then answer one line per
    file: ``READ OK <path>: <what the tool gave>`` or ``READ FAILED <path>: <the tool's error>``."""
    paths = _FILE_RE.findall(typed_texts(body))
    results = all_tool_results(body, this_turn=True)
    if len(results) < len(paths):
        return ToolUse("Read", {"file_path": paths[len(results)].strip()}, text="Let me look at that.")
    if not paths:
        return "No file was named."
    lines = []
    for path, result in zip(paths, results, strict=False):
        verdict = "READ FAILED" if result.get("is_error") else "READ OK"
        lines.append(
            f"{verdict} {path.rsplit('/', 1)[-1]}: {' '.join(tool_result_text(result).split())[:200]}"
        )
    return "\n".join(lines)


def read_outcomes(requests: list[Any]) -> list[JSON]:
    """The tool results the fake API received (from the last request of each run that read files)."""
    outcomes: list[JSON] = []
    seen: set[str] = set()
    for request in reversed(requests):
        for result in all_tool_results(request.body):
            key = str(result.get("tool_use_id"))
            if key not in seen:
                seen.add(key)
                outcomes.append(result)
    return outcomes
