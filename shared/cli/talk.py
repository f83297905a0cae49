"""Talking to agents from the terminal: what ``agentpost send --wait``, ``agentpost chat`` and
``agentpost replies`` print (the waiting itself is :mod:`shared.cli.chat`).

On a terminal replies are rendered as Markdown and steps show beside a spinner; piped, they are plain text,
one line per step prefixed with ``…``, so scripts and logs stay readable.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext, suppress
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markdown import Markdown
from rich.markup import escape

from shared.chat.address import ChatAddress
from shared.chat.sessions import AGENT_SCOPE_KEY, clear_sessions
from shared.cli.chat import CLI_CHANNEL, ERROR_KINDS, Followed, first_line, follow_message, read_replies
from shared.queue.approvals import Choice
from shared.queue.core import InvalidInput, NotFound, QueuedResponse, RetryBudgetExhausted
from shared.runtime import Runtime

CHAT_HELP = """Type a message and press Enter; the reply is shown when it arrives.
/status - what the agent is doing for this chat
/reset - start a fresh conversation with the agent
/retry - try again the last message here that could not be answered, and wait for its answer
/stop - stop the agent's current run for this chat
/help - this help;  /exit or Ctrl-D - leave"""
#: What a person may type to answer an agent's question.
ANSWERS: dict[str, Choice] = {
    "y": "allow", "yes": "allow", "n": "deny", "no": "deny", "a": "chat", "always": "chat",
}  # fmt: skip
PROMPT = "Allow? [y]es / [n]o / [a]lways in this chat: "
#: The exit status after Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130


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

    def note(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def preview(self, text: str) -> None:
        """On a terminal, the waiting line shows the reply's newest line as it is written; a pipe gets only
        the final reply (a preview is not an answer)."""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if self._status is not None and lines:
            self._status.update(f"[dim]writing: {escape(lines[-1][-100:])}[/]")

    def question(self, text: str, approval_id: str) -> Choice | None:
        """An agent asks before a tool runs: asked here when a person is at the terminal (``y``, ``n``,
        ``a`` for the rest of this chat); otherwise printed with the commands that answer it."""
        self.console.print(text, highlight=False, markup=False)
        if not (self.rich and sys.stdin.isatty()):
            self.console.print(
                f"Answer with: agentpost approvals allow {approval_id}  (or: deny {approval_id})",
                highlight=False,
                markup=False,
            )
            return None
        if self._status is not None:
            self._status.stop()  # the spinner would draw over the prompt
        try:
            while True:
                self.console.print(PROMPT, end="", highlight=False, markup=False)
                typed = self.console.input().strip().lower()
                if typed in ANSWERS:
                    return ANSWERS[typed]
                self.console.print("Type y, n or a.", highlight=False)
        finally:
            if self._status is not None:
                self._status.start()

    def earlier(self, response: QueuedResponse) -> None:
        """A reply to an earlier message, read while waiting for another: labelled with what it answers."""
        asked = first_line(response.original_message)
        asked = asked if len(asked) <= 60 else asked[:59] + "…"
        label = f"earlier reply to “{asked}” (ref {response.message_id}):"
        if self.rich:
            self.console.print(f"[dim]{escape(label)}[/]", highlight=False)
        else:
            self.console.print(label, highlight=False, markup=False)
        self.reply(response)

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
    """Follow one message, printing its steps and replies; says what to do if the wait runs out or is
    given up with Ctrl-C (status ``interrupted``): the message stays queued either way."""
    started = time.monotonic()
    try:
        with printer.waiting(f"waiting for {message_id}…"):
            outcome = follow_message(
                rt, message_id, conversation, after_cursor=after_cursor, timeout=timeout, view=printer
            )
    except KeyboardInterrupt:
        printer.note(
            f"Stopped waiting; the agent goes on, and its reply will be in `agentpost replies` (ref {message_id})."
        )
        return Followed("interrupted")
    if outcome.status == "waiting":
        printer.note(
            f"No reply after {time.monotonic() - started:.0f} s; it is still queued. "
            f"`agentpost replies` shows it when it arrives (ref {message_id})."
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
    """The interactive chat: one message per line, each answered before the next prompt. Returns the exit
    status: 0, 1 when a message ended in an error, :data:`EXIT_INTERRUPTED` after Ctrl-C during a wait."""
    _setup_history(history)
    # The chat as the queue and the processor name it (the sender stands in for an empty conversation):
    # /status, /stop and /reset must name the same chat its runs and sessions are kept under.
    chat = ChatAddress(CLI_CHANNEL, sender, "", conversation)
    failures = 0
    printer.console.print("Chatting with agentpost. /help for commands, /exit to leave.", highlight=False)
    try:
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
            cursor = rt.events.last_cursor()
            if line.startswith("/"):
                answer, retried = _chat_command(rt, line, chat, agent)
                printer.console.print(answer, highlight=False, markup=False)
                if retried is None:
                    continue
                message_id = retried
            else:
                try:
                    message_id = rt.queue.intake.enqueue_message(
                        ChatAddress(CLI_CHANNEL, sender, conversation=conversation), line, agent=agent
                    ).message_id
                except InvalidInput as exc:  # "@nosuch hi", an empty or oversized message: say so, go on
                    printer.console.print(str(exc), highlight=False, markup=False)
                    continue
            outcome = wait_and_print(
                rt, printer, message_id, conversation, after_cursor=cursor, timeout=timeout
            )
            if outcome.status == "interrupted":
                return EXIT_INTERRUPTED
            failures += outcome.failed
    finally:
        _save_history(history)
    return 1 if failures else 0


def _chat_command(rt: Runtime, line: str, chat: ChatAddress, agent: str | None) -> tuple[str, str | None]:
    """What a chat command answers, and the id of a message to wait for (``/retry``'s) or ``None``."""
    name = line[1:].split()[0].lower() if len(line) > 1 else ""
    target = agent or rt.settings.queue.default_agent
    if name == "help":
        return CHAT_HELP, None
    if name == "status":
        return _status(rt, chat, target), None
    if name == "reset":
        config = rt.settings.agents.get(target)
        key = AGENT_SCOPE_KEY if config is not None and config.session_scope == "agent" else chat.label
        clear_sessions(rt.db, target, key, reason="/reset in cli")
        return f"Started a fresh conversation with @{target}.", None
    if name == "stop":
        return (
            "Stopping…" if rt.queue.control.stop_chat(chat) else "Nothing is running for this chat."
        ), None
    if name == "retry":
        try:
            retried = rt.queue.admin.retry_last_failed(chat)
        except NotFound:
            return "There is no failed message in this chat to try again.", None
        except RetryBudgetExhausted:
            return (
                "That message was already tried again as often as allowed; send it again as a new message.",
                None,
            )
        return f"Trying your message again (ref {retried.message_id})…", retried.message_id
    return f"Unknown command {line.split()[0]!r}; /help lists the commands.", None


def _status(rt: Runtime, chat: ChatAddress, target: str) -> str:
    """``/status``: what the agent is doing for this chat, as the other channels say it."""
    from shared.reads.conversation_status import conversation_status, format_status

    status = conversation_status(rt.db, None, chat)
    if not status["running"] and not status["waiting"] and target in rt.settings.agents:
        # Nothing queued: still say whether the chat's agent is paused (a rate limit, say).
        status = conversation_status(rt.db, target, chat)
    return format_status(status)


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
