"""OpenAI Codex, the ``codex`` provider: ``codex exec --json`` and what a line of its JSONL output means
(see :mod:`workers.providers.base` for the interface and the runner every provider shares)."""

from __future__ import annotations

from shared.settings.providers import CODEX
from workers.providers.base import (
    CliProvider,
    RunRequest,
    StreamState,
    find_binary,
)
from workers.providers.cli_output import json_line, looks_overloaded, looks_rate_limited


class CodexProvider(CliProvider):
    """OpenAI Codex CLI in ``exec --json`` mode (JSONL events; the last agent message is the reply)."""

    name = CODEX.name
    service = CODEX.service
    spool_keys = frozenset({"text"})  # an agent_message's text: the reply

    def argv(self, request: RunRequest) -> list[str]:
        s = request.settings
        argv = [
            find_binary(CODEX.binary, request, CODEX.binary_env),
            *s.command[1:],
            "exec",
            "--json",
            "--skip-git-repo-check",
        ]
        if s.model:
            argv += ["--model", s.model]
        if s.permission_mode == "bypassPermissions":
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        elif s.permission_mode in ("acceptEdits", "dontAsk"):
            argv.append("--full-auto")
        else:
            argv += ["--sandbox", "read-only"]
        if request.session_id:
            argv += ["resume", request.session_id]
        argv.append("-")
        return argv

    def parse_line(self, line: str, state: StreamState) -> list[str]:
        event = json_line(line)
        if event is None:
            return []
        kind = event.get("type")
        if kind == "thread.started" and isinstance(event.get("thread_id"), str):
            state.session_id = event["thread_id"]
        elif kind == "item.completed":
            item = event.get("item") or {}
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                cut = state.cuts.pop(item["text"], None)
                if state.final_whole is not None:
                    state.final_whole.close()  # an earlier message's: the last one is the reply
                state.final_whole = cut.spool if cut is not None else None
                state.final_text = cut.spool.text() if cut is not None and cut.spool else item["text"]
                return [item["text"]]
        elif kind == "turn.failed":
            error = event.get("error") or {}
            state.error = f"codex turn failed: {error.get('message', 'unknown error')}"
            state.overloaded = looks_overloaded(state.error)
            state.rate_limited = not state.overloaded and looks_rate_limited(state.error)
        elif kind == "error":
            state.error = f"codex error: {event.get('message', 'unknown error')}"
            state.overloaded = looks_overloaded(state.error)
            state.rate_limited = not state.overloaded and looks_rate_limited(state.error)
        return []
