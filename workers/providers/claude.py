"""Claude Code, the ``claude`` provider: how its CLI is started and what a line of its ``stream-json`` output
means (see :mod:`workers.providers.base` for the interface, the runner every provider shares and what the
argv looks like). Its warm mode, a CLI kept running between a chat's runs, is :mod:`.claude_warm`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from shared.settings.providers import CLAUDE
from workers.errors import api_retry_notice
from workers.providers.base import (
    CliProvider,
    ProgressFn,
    ProviderError,
    RunRequest,
    RunResult,
    RunUsage,
    StreamState,
    find_binary,
)
from workers.providers.claude_warm import split_session_ref
from workers.providers.cli_output import json_line, looks_overloaded, looks_rate_limited
from workers.providers.permissions import tool_ask

#: A retry the CLI reports is told to the chat from this retry on, or earlier when its wait is this long:
#: a single quick retry that works (a blip) is not worth a message, a run gone quiet for minutes is.
NOTICE_FROM_RETRY = 2
NOTICE_FROM_DELAY_MS = 3000


# -- claude --------------------------------------------------------------------------------------------
class ClaudeProvider(CliProvider):
    """Claude Code in print mode with ``stream-json`` output."""

    name = CLAUDE.name
    service = CLAUDE.service
    spool_keys = frozenset({"result"})  # the reply, kept whole however long its line is

    def argv(self, request: RunRequest) -> list[str]:
        s = request.settings
        argv = [find_binary(CLAUDE.binary, request, CLAUDE.binary_env), *s.command[1:]]
        # Partial messages: a line per streamed delta, so a long reply shows it is alive (idle timeout).
        argv += ["-p", "--output-format", "stream-json", "--verbose", "--include-partial-messages"]
        if request.session_id:
            # A fork: the run writes into a new session (its id is recorded only when the run succeeds),
            # so a refused, failed or killed run leaves nothing in the conversation the next run resumes.
            # A session a warm turn recorded (claude_warm.py) also names the point to resume at:
            # whatever a later turn of that process left in the session file is not continued.
            session, at = split_session_ref(request.session_id)
            argv += ["--resume", session, *(["--resume-session-at", at] if at else []), "--fork-session"]
        if s.model:
            argv += ["--model", s.model]
        if s.fallback_model:
            argv += ["--fallback-model", s.fallback_model]
        if request.system_prompt:
            argv += ["--append-system-prompt", request.system_prompt]
        if s.permission_mode == "ask":
            # The CLI's prompts come to us as control requests (permissions.py); only a stream-json turn
            # can answer them (the processor runs "ask" agents so), elsewhere closed stdin denies them.
            argv += ["--permission-prompt-tool", "stdio", "--permission-mode", "default"]
        elif s.permission_mode != "default":
            argv += ["--permission-mode", s.permission_mode]
        for folder in request.read_dirs:
            argv += read_access(folder)
        return argv

    async def run(self, request: RunRequest, progress: ProgressFn) -> RunResult:
        if request.warm is None:
            return await super().run(request, progress)
        try:
            # The echo of each user message taken in tells a run that was handed more messages (the steer
            # busy policy) which result answers the last of them (claude_warm.py).
            argv = [*self.argv(request), "--input-format", "stream-json", "--replay-user-messages"]
        except ProviderError as exc:
            return RunResult(ok=False, error=str(exc), cannot_start=True, service=self.service)
        # One turn of a CLI kept running for this chat (claude_warm.py): the prompt becomes a
        # stream-json user message on its stdin.
        return await request.warm.turn(self, request, argv, progress)

    def parse_line(self, line: str, state: StreamState) -> list[str]:
        event = json_line(line)
        if event is None:
            return []
        kind = event.get("type")
        if isinstance(event.get("session_id"), str) and event["session_id"]:
            state.session_id = event["session_id"]
        if kind == "control_request":
            ask = tool_ask(event)
            if ask is not None:
                state.asks.append(ask)
            return []
        if kind == "system" and event.get("subtype") == "api_retry":
            self._api_retry(event, state)
            return []
        if kind == "stream_event":
            _stream_event(event, state)
            return []
        if kind == "assistant":
            message = event.get("message") or {}
            if event.get("is_api_error_message") or event.get("error"):
                return []  # the CLI's synthetic error text: never progress, never the answer
            blocks = [b for b in message.get("content") or [] if isinstance(b, dict)]
            # Progress only: the reply is the result line's (kept whole even from a line too long to hold).
            texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
            # Tool calls are steps too (for "last step" notes), but never part of the answer.
            steps = [_tool_step(b) for b in blocks if b.get("type") == "tool_use"]
            return texts + steps
        if kind == "result":
            state.usage = _claude_usage(event)
            result = event.get("result")
            if event.get("is_error") or event.get("subtype") not in (None, "success"):
                status = event.get("api_error_status")
                state.status = status if isinstance(status, int) else _status_in(str(result or ""))
                text = str(result or "")
                state.overloaded = (
                    state.status == 529
                    or event.get("api_error_type") == "overloaded_error"
                    or looks_overloaded(text)
                )
                state.rate_limited = not state.overloaded and (
                    state.status == 429
                    or event.get("api_error_type") == "rate_limit_error"
                    or looks_rate_limited(text)
                )
                errors = [str(e) for e in event.get("errors") or [] if e]
                # A --resume of a conversation this host's CLI home does not have (another host ran it).
                state.session_missing = any("No conversation found" in e for e in errors)
                # --resume-session-at naming a message the session file does not hold (2.1.332: "No message
                # found with message.uuid of: U"); every later resume there would fail the same way.
                state.resume_point_missing = any("No message found with message.uuid" in e for e in errors)
                detail = result if isinstance(result, str) and result else "; ".join(errors)
                detail = detail or str(event.get("subtype"))
                state.error = (
                    f"claude reported an error ({event.get('terminal_reason') or 'error'}): {detail}"
                )
            else:
                cut = state.cuts.pop(result, None) if isinstance(result, str) else None
                if state.final_whole is not None:
                    state.final_whole.close()  # an earlier turn's (claude_warm.py)
                    state.final_whole = None
                if cut is not None and cut.spool is not None:  # from a line too long to hold
                    state.final_whole = cut.spool
                    state.final_text = cut.spool.text()
                else:
                    state.final_text = result if isinstance(result, str) else ""
        return []

    def _api_retry(self, event: dict[str, Any], state: StreamState) -> None:
        """``{"type": "system", "subtype": "api_retry", "attempt": 1, "max_retries": 10, "retry_delay_ms":
        565, "error_status": 529, "error": "overloaded"}``: the CLI is about to retry a failed API call
        (2.1.332 prints one per retry, for 401, 408, 409, 429, 5xx, 529 and refused connections)."""
        attempt, delay = _int(event.get("attempt")), _int(event.get("retry_delay_ms"))
        if attempt < NOTICE_FROM_RETRY and delay < NOTICE_FROM_DELAY_MS:
            return
        status = event.get("error_status")
        state.notices.append(
            api_retry_notice(
                self.service,
                status=status if isinstance(status, int) else None,
                error=str(event.get("error") or ""),
                attempt=attempt,
                max_retries=_int(event.get("max_retries")),
                delay_ms=delay,
            )
        )

    def finish(self, state: StreamState, exit_code: int, stderr: str) -> RunResult:
        if state.error is None and exit_code == 0 and state.final_text is None:
            return RunResult(ok=False, error="claude exited without a result line", exit_code=exit_code)
        return super().finish(state, exit_code, stderr)


def _stream_event(event: dict[str, Any], state: StreamState) -> None:
    """A ``stream_event`` line (``--include-partial-messages``): the API's own stream events, one line
    each, e.g. ``{"type": "stream_event", "event": {"type": "content_block_delta", "index": 0, "delta":
    {"type": "text_delta", "text": "Hel"}}, "parent_tool_use_id": null, ...}``. Text deltas of the run's
    own messages grow :attr:`StreamState.partial`; a new message starts it again. A subagent's stream
    (``parent_tool_use_id`` set) is not the answer and is left out."""
    if event.get("parent_tool_use_id"):
        return
    inner = event.get("event")
    if not isinstance(inner, dict):
        return
    if inner.get("type") == "message_start":
        if state.partial:
            state.partial.clear()
            state.partial_grew = True
        return
    delta = inner.get("delta")
    if inner.get("type") == "content_block_delta" and isinstance(delta, dict):
        text = delta.get("text")
        if delta.get("type") == "text_delta" and isinstance(text, str) and text:
            # Past the preview's length nothing shown changes: no more work per delta (PartialText).
            state.partial_grew = state.partial.append(text) or state.partial_grew


#: Paths a Claude permission rule can carry as written (the rule syntax has its own meaning for brackets,
#: wildcards, commas and spaces).
_RULE_SAFE_PATH = re.compile(r"/[A-Za-z0-9._/+@=-]*")


def read_access(folder: Path) -> list[str]:
    """Claude arguments that let a run read ``folder`` and everything in it, without asking and without
    write access: the permission rule ``Read(//abs/folder/**)`` (``//`` marks an absolute path).
    ``--add-dir`` would work too, but it makes the folder a working directory, writable under
    ``acceptEdits`` (measured with 2.1.332); it is used only for a path the rule syntax cannot carry.
    """
    path = str(folder.resolve() if folder.is_absolute() else folder.absolute())
    if _RULE_SAFE_PATH.fullmatch(path):
        return ["--allowedTools", f"Read(/{path.rstrip('/')}/**)"]
    return ["--add-dir", path]


def _claude_usage(event: dict[str, Any]) -> RunUsage | None:
    """The tokens and cost of this run from a claude ``result`` line; None when it carries none.

    ``usage`` counts this run's tokens, but ``total_cost_usd`` and ``modelUsage`` add up the whole session,
    and a run that resumes a conversation starts from the cost of the earlier ones (2.1.332: the second run
    of a conversation reports both runs' cost). ``model_usage_since_last_result`` is this run's share per
    model; only a CLI without it is taken at ``total_cost_usd``.
    """
    usage = event.get("usage")
    total = event.get("total_cost_usd")
    if not isinstance(usage, dict) and not isinstance(total, int | float):
        return None
    usage = usage if isinstance(usage, dict) else {}
    own = event.get("model_usage_since_last_result")
    models = own if isinstance(own, dict) and own else event.get("modelUsage")
    costs: dict[str, float] = {}
    if isinstance(models, dict):
        for name, entry in models.items():
            value = entry.get("costUSD") if isinstance(entry, dict) else None
            costs[str(name)] = float(value) if isinstance(value, int | float) else 0.0
    if isinstance(own, dict) and own:
        cost = sum(costs.values())
    else:
        cost = float(total) if isinstance(total, int | float) else 0.0
    return RunUsage(
        input_tokens=_int(usage.get("input_tokens")),
        output_tokens=_int(usage.get("output_tokens")),
        cache_read_tokens=_int(usage.get("cache_read_input_tokens")),
        cache_write_tokens=_int(usage.get("cache_creation_input_tokens")),
        cost_usd=cost,
        # The model that cost most is the one the run was about (a cheap helper model may answer too).
        model=max(costs, key=lambda name: costs[name]) if costs else "",
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _status_in(text: str) -> int | None:
    """An HTTP status named in the CLI's error text (``API Error: 400 {...}``), if any."""
    match = re.search(r"\b(?:API Error|status)[: ]+([45]\d\d)\b", text, re.IGNORECASE)
    return int(match.group(1)) if match else None


def _tool_step(block: dict[str, Any]) -> str:
    """``Bash: npm test``: one tool call as a short step description."""
    name = str(block.get("name") or "tool")
    args = block.get("input") if isinstance(block.get("input"), dict) else {}
    assert isinstance(args, dict)
    detail = next(
        (
            str(args[k])
            for k in ("command", "description", "file_path", "path", "pattern", "url")
            if args.get(k)
        ),
        "",
    )
    return f"{name}: {' '.join(detail.split())[:120]}" if detail else name
