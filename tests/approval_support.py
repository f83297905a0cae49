"""The scripted model of the approval tests (``permission_mode = "ask"``): it asks for Bash, then says what
the tool gave; and a count of the command's runs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.fakes.anthropic_api import Reply, ToolUse, last_user_text, tool_result_text, tool_results


def asking_model(body: dict[str, Any]) -> str | Reply:
    """For a prompt naming ``marker-N``: ask to run ``echo ran >> marker-N.txt`` (each run adds a line), then
    answer ``TOOL RAN: …`` or ``TOOL FAILED: …`` (a denial is the tool's error). Other prompts: ``hello``."""
    results = tool_results(body)
    if not results:
        found = re.search(r"marker-(\d+)", last_user_text(body))
        if found is None:
            return "hello"
        command = f"echo ran >> marker-{found.group(1)}.txt"
        return ToolUse("Bash", {"command": command, "description": "Write the marker"})
    result = results[-1]
    verdict = "TOOL FAILED" if result.get("is_error") else "TOOL RAN"
    return f"{verdict}: {tool_result_text(result)[:160]}"


def command_runs(root: Path, n: int) -> int:
    """How many times the command of ``marker-N`` ran anywhere under ``root`` (a line each)."""
    return sum(len(p.read_text().splitlines()) for p in root.rglob(f"marker-{n}.txt") if p.is_file())
