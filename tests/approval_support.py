"""The scripted model of the approval tests (``permission_mode = "ask"``): it asks for Bash, then says what
the tool gave; a count of the command's runs; and a request made as a run makes it, for the chat tests of one
platform (:func:`ask_for_bash`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue import approvals
from shared.runtime import Runtime
from tests.fakes.anthropic_api import Reply, ToolUse, last_user_text, tool_result_text, tool_results
from tests.probes import wait_for


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


COMMAND = "echo ran > marker.txt"


def ask_for_bash(
    rt: Runtime,
    chat: ChatAddress | None,
    message_id: str,
    *,
    command: str = COMMAND,
    agent: str = "alpha",
    description: str = "",
    run_id: str = "",
    timeout_ms: int = 600_000,
) -> approvals.Approval:
    """``agent`` asks ``chat`` whether it may run ``command`` with Bash (as a run of ``message_id`` in
    ``ask`` mode would; "allow for this chat" remembers the command's first word); the question is queued to
    the chat."""
    tool_input = {"command": command, **({"description": description} if description else {})}
    question = approvals.Question(
        agent=agent,
        tool="Bash",
        summary=command,
        detail=json.dumps(tool_input),
        pattern=command.split()[0] + " *",
        message_id=message_id,
        run_id=run_id,
        chat=chat,
        timeout_ms=timeout_ms,
    )
    asked = approvals.ask(rt.db, rt.queue.responses, question)
    # Requests list oldest first (created_at, then a random id): the next one asked must not share the
    # millisecond, or two asked one after the other could list the other way round.
    wait_for(
        lambda: now_ms() > asked.created_at, 5, "the clock to pass the request's millisecond", interval=0.001
    )
    return asked


def status_of(rt: Runtime, approval_id: str) -> str:
    """The request's status now (``pending``, ``allowed`` …)."""
    found = approvals.get(rt.db, approval_id)
    assert found is not None, approval_id
    return str(found.status)
