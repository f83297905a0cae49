"""Permission prompts of the claude CLI, answered by a person (``[agents.X] permission_mode = "ask"``).

Started with ``--permission-prompt-tool stdio`` and stream-json input, the CLI does not decide a tool use it
would ask a person about: it prints a control request on stdout and waits for the host's answer on stdin
(checked with the pinned CLI)::

    {"type": "control_request", "request_id": "…", "request": {"subtype": "can_use_tool", "tool_name": "Bash",
     "input": {"command": "…"}, "permission_suggestions": [{"type": "addRules", "rules": [{"toolName": "Bash",
     "ruleContent": "echo hi *"}], …}], "tool_use_id": "…"}}

    {"type": "control_response", "response": {"subtype": "success", "request_id": "…",
     "response": {"behavior": "allow", "updatedInput": {…}}}}        (or {"behavior": "deny", "message": "…"})

A denial is handed to the model as the tool's error, so the agent goes on and can say what it could not do.
Closing stdin before an answer denies the tool ("Tool permission stream closed before response received").

This module reads such a request into a :class:`ToolAsk` (what a person is shown: the command, the file and a
short diff for an edit) and writes the answer; who is asked and how is the processor's
(:mod:`workers.approvals`), reached through ``RunRequest.ask``.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

#: The longest part of a tool's input a question shows (a chat message has room for little more).
SUMMARY_CHARS = 1500
#: The most lines of an edit's diff a question shows.
DIFF_LINES = 24
#: The most of a tool's input kept with the request (for ``approvals list --json`` and the dashboard).
DETAIL_CHARS = 8000


@dataclass(frozen=True)
class ToolAsk:
    """One tool use the CLI asks about."""

    request_id: str
    tool: str
    input: dict[str, Any]
    #: What a person reads: the command, or the file and a short diff.
    summary: str
    #: What "allow for this chat" allows later: the tool with this pattern (``*`` for anything).
    pattern: str
    #: What a later use is matched against (the command; the file).
    subject: str


@dataclass(frozen=True)
class ToolDecision:
    """The answer: allowed, or denied with the reason the model is told."""

    allow: bool
    message: str = ""


#: Asks a person about one tool use and returns the answer (``RunRequest.ask``).
AskFn = Callable[[ToolAsk], Awaitable[ToolDecision]]


def tool_ask(event: dict[str, Any]) -> ToolAsk | None:
    """The :class:`ToolAsk` of a ``control_request`` line (None: not a permission prompt)."""
    request = event.get("request")
    if event.get("type") != "control_request" or not isinstance(request, dict):
        return None
    if request.get("subtype") != "can_use_tool":
        return None
    tool = str(request.get("tool_name") or "tool")
    tool_input = request.get("input") if isinstance(request.get("input"), dict) else {}
    assert isinstance(tool_input, dict)
    subject = subject_of(tool, tool_input)
    return ToolAsk(
        request_id=str(event.get("request_id") or ""),
        tool=tool,
        input=tool_input,
        summary=summarize(tool, tool_input),
        pattern=pattern_of(tool, tool_input, request.get("permission_suggestions")),
        subject=subject,
    )


def control_response(ask: ToolAsk, decision: ToolDecision) -> bytes:
    """The stdin line answering ``ask``."""
    answer: dict[str, Any] = (
        {"behavior": "allow", "updatedInput": ask.input}
        if decision.allow
        else {"behavior": "deny", "message": decision.message or "The person asked denied this."}
    )
    line = {
        "type": "control_response",
        "response": {"subtype": "success", "request_id": ask.request_id, "response": answer},
    }
    return (json.dumps(line) + "\n").encode()


def subject_of(tool: str, tool_input: dict[str, Any]) -> str:
    """What a tool use acts on: the command, the file, the address, the pattern."""
    for key in ("command", "file_path", "notebook_path", "path", "url", "pattern", "query"):
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def pattern_of(tool: str, tool_input: dict[str, Any], suggestions: object) -> str:
    """What "allow for this chat" remembers: the CLI's own suggested rule for the tool when it offers one
    (``echo hi *``: that command with any arguments), else the command's first word with any arguments,
    else the file or address itself."""
    if isinstance(suggestions, list):
        for suggestion in suggestions:
            rules = suggestion.get("rules") if isinstance(suggestion, dict) else None
            for rule in rules if isinstance(rules, list) else []:
                if isinstance(rule, dict) and rule.get("toolName") == tool and rule.get("ruleContent"):
                    return str(rule["ruleContent"])
    subject = subject_of(tool, tool_input)
    if tool == "Bash" and subject.split():
        return f"{subject.split()[0]} *"
    return subject


def summarize(tool: str, tool_input: dict[str, Any]) -> str:
    """A tool use in a person's words: the command; the file and a short diff for an edit."""
    if tool == "Bash":
        command = str(tool_input.get("command") or "")
        why = str(tool_input.get("description") or "")
        return _bound(f"{command}" + (f"\n({why})" if why else ""))
    path = str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")
    if tool == "Edit" and path:
        old = str(tool_input.get("old_string") or "")
        new = str(tool_input.get("new_string") or "")
        return _bound(f"edit {path}\n{short_diff(old, new)}")
    if tool == "MultiEdit" and path:
        edits = tool_input.get("edits") if isinstance(tool_input.get("edits"), list) else []
        assert isinstance(edits, list)
        diffs = [
            short_diff(str(e.get("old_string") or ""), str(e.get("new_string") or ""))
            for e in edits
            if isinstance(e, dict)
        ]
        return _bound(f"edit {path} ({len(diffs)} changes)\n" + "\n".join(diffs))
    if tool == "Write" and path:
        content = str(tool_input.get("content") or "")
        lines = content.splitlines()
        head = "\n".join(f"+ {line}" for line in lines[:DIFF_LINES])
        more = f"\n… {len(lines) - DIFF_LINES} more lines" if len(lines) > DIFF_LINES else ""
        return _bound(f"write {path} ({len(lines)} lines)\n{head}{more}")
    subject = subject_of(tool, tool_input)
    if subject:
        return _bound(subject)
    return _bound(json.dumps(tool_input, ensure_ascii=False)[:SUMMARY_CHARS])


def short_diff(old: str, new: str) -> str:
    """The changed lines of an edit, ``-`` before ``+``, at most :data:`DIFF_LINES`."""
    lines = [
        line
        for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
        if not line.startswith(("---", "+++", "@@"))
    ]
    shown = lines[:DIFF_LINES]
    more = f"\n… {len(lines) - DIFF_LINES} more lines" if len(lines) > DIFF_LINES else ""
    return "\n".join(f"{line[0]} {line[1:]}" for line in shown) + more


def detail_of(ask: ToolAsk) -> str:
    """The tool's input as JSON, bounded, as the request keeps it."""
    text = json.dumps(ask.input, ensure_ascii=False)
    if len(text) <= DETAIL_CHARS:
        return text
    return json.dumps({"command": ask.subject[:DETAIL_CHARS], "truncated": True}, ensure_ascii=False)


def _bound(text: str) -> str:
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"
