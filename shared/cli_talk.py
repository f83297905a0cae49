"""Talking to agents from the terminal: what ``agentpost send --wait``, ``agentpost chat`` and
``agentpost replies`` print (the waiting itself is :mod:`shared.cli_chat`).

On a terminal replies are rendered as Markdown and steps show beside a spinner; piped, they are plain text,
one line per step prefixed with ``…``, so scripts and logs stay readable.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape

from shared.cli_chat import CLI_CHANNEL, ERROR_KINDS, Followed, follow_message, read_replies
from shared.queue import InvalidInput, QueuedResponse
from shared.runtime import Runtime
from shared.sessions import clear_sessions

CHAT_HELP = """Type a message and press Enter; the reply is shown when it arrives.
/reset - start a fresh conversation with the agent
/retry - try again the last message here that could not be answered
/stop - stop the agent's current run for this chat
/help - this help;  /exit or Ctrl-D - leave"""


def reply_json(response: QueuedResponse) -> dict[str, Any]:
    """A reply as ``--json`` prints it."""
    meta = response.metadata or {}
    return {
        "message_id": response.message_id,
        "agent": response.agent,
        "kind": meta.get("kind", "reply"),
        "text": response.message,
        "files": list(response.files),
        "created_at": response.created_at,
    }


class Printer:
    """Prints steps and replies for a person (rich) or for a pipe (plain)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.rich = console.is_terminal
        self._status: Any = None

    def waiting(self, what: str) -> AbstractContextManager[Any]:
        if not self.rich:
            return nullcontext()
        self._status = self.console.status(what, spinner="dots")
        return self._status  # type: ignore[no-any-return]

    def step(self, text: str) -> None:
        line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        if not line:
            return
        if self._status is not None:
            self._status.update(f"[dim]{escape(line[:100])}[/]")
        else:
            self.console.print(f"… {line}", highlight=False, markup=False)

    def reply(self, response: QueuedResponse) -> None:
        meta = response.metadata or {}
        who = meta.get("from_agent") or response.agent or "agent"
        error = meta.get("kind") in ERROR_KINDS
        if self.rich:
            colour = "red" if error else "cyan"
            self.console.print(f"[bold {colour}]{escape(str(who))}[/]")
            self.console.print(Markdown(response.message))
        else:
            self.console.print(response.message, highlight=False, markup=False)
        for f in response.files:
            self.console.print(f"(file: {f})", highlight=False, markup=False)


def wait_and_print(
    rt: Runtime,
    printer: Printer,
    message_id: str,
    conversation: str,
    *,
    after_cursor: str,
    timeout: float,
) -> Followed:
    """Follow one message, printing its steps and replies; says what to do if the wait runs out."""
    started = time.monotonic()
    with printer.waiting(f"waiting for {message_id}…"):
        outcome = follow_message(
            rt,
            message_id,
            conversation,
            after_cursor=after_cursor,
            timeout=timeout,
            on_step=printer.step,
            on_reply=printer.reply,
        )
    if outcome.status == "waiting":
        printer.console.print(
            f"No reply after {time.monotonic() - started:.0f} s; it is still queued. "
            f"`agentpost replies` shows it when it arrives (ref {message_id}).",
            highlight=False,
            markup=False,
        )
    return outcome


def chat_loop(
    rt: Runtime,
    printer: Printer,
    conversation: str,
    *,
    sender: str,
    agent: str | None,
    timeout: float,
    history: Path,
    read_line: Callable[[str], str] = input,
) -> int:
    """The interactive chat: one message per line, each answered before the next prompt. Returns the
    number of messages that ended in an error."""
    _setup_history(history)
    failures = 0
    printer.console.print("Chatting with agentpost. /help for commands, /exit to leave.", highlight=False)
    while True:
        try:
            line = read_line("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            printer.console.print()
            break
        if not line:
            continue
        if line in ("/exit", "/quit"):
            break
        if line.startswith("/"):
            printer.console.print(_chat_command(rt, line, conversation, agent), highlight=False, markup=False)
            continue
        cursor = rt.events.last_cursor()
        try:
            result = rt.queue.enqueue_message(
                CLI_CHANNEL, sender, line, agent=agent, conversation=conversation
            )
        except InvalidInput as exc:  # "@nosuch hi", an empty or oversized message: say so, keep chatting
            printer.console.print(str(exc), highlight=False, markup=False)
            continue
        outcome = wait_and_print(
            rt, printer, result.message_id, conversation, after_cursor=cursor, timeout=timeout
        )
        failures += outcome.failed
    _save_history(history)
    return failures


def _chat_command(rt: Runtime, line: str, conversation: str, agent: str | None) -> str:
    name = line[1:].split()[0].lower() if len(line) > 1 else ""
    target = agent or rt.settings.queue.default_agent
    if name == "help":
        return CHAT_HELP
    if name == "reset":
        config = rt.settings.agents.get(target)
        key = (
            "" if config is not None and config.session_scope == "agent" else f"{CLI_CHANNEL}:{conversation}"
        )
        clear_sessions(rt.db, target, key, reason="/reset in cli")
        return f"Started a fresh conversation with @{target}."
    if name == "stop":
        rt.queue.request_stop(target, f"{CLI_CHANNEL}:{conversation}")
        return "Stopping…"
    if name == "retry":
        from shared.queue import NotFound, RetryBudgetExhausted

        try:
            retried = rt.queue.retry_last_failed(CLI_CHANNEL, conversation)
        except NotFound:
            return "There is no failed message in this chat to try again."
        except RetryBudgetExhausted:
            return "That message was already tried again as often as allowed; send it again as a new message."
        return f"Trying your message again (ref {retried.message_id}); its reply will show after your next message."
    return f"Unknown command {line.split()[0]!r}. {CHAT_HELP.splitlines()[1]}"


def show_unread(rt: Runtime, printer: Printer, conversation: str, *, as_json: bool) -> int:
    """``agentpost replies``: print and acknowledge the CLI replies nobody has read yet."""
    read: list[QueuedResponse] = []
    read_replies(rt, conversation, lambda r: read.append(r), notes=False)
    answers = [r for r in read if (r.metadata or {}).get("kind") != "progress"]
    if as_json:
        printer.console.print_json(json.dumps([reply_json(r) for r in answers]))
    elif not answers:
        printer.console.print("No unread replies.", highlight=False)
    for response in [] if as_json else answers:
        printer.reply(response)
    return len(answers)


def _setup_history(path: Path) -> None:
    try:
        import readline  # line editing and history where the platform has it
    except ImportError:
        return
    with suppress(OSError):
        readline.read_history_file(path)


def _save_history(path: Path) -> None:
    try:
        import readline
    except ImportError:
        return
    with suppress(OSError):
        readline.set_history_length(1000)
        readline.write_history_file(path)
