"""The ``agentpost`` command. Core commands live here; process kinds, channels and extra command groups
are found through entry points, so ``shared`` never imports ``workers``, ``adapters`` or ``scheduler``:

- ``agentpost.processes``: ``name = "module:function"``, ``function(runtime_home: Path | None) -> None``
  runs one process kind in the foreground (``agentpost run NAME``);
- ``agentpost.channels``: channel plugin classes; ``agentpost run NAME`` runs the class under the channel runner (``agentpost.channel_runner``);
- ``agentpost.commands``: ``register(app: typer.Typer) -> None`` adds commands or groups.

A person waits for every command, so this module imports little at start: the plugins' command modules
are loaded only when the command line may need one (not for the core commands below), the terminal
renderer only for the commands that render replies, and the database opens without SQLAlchemy when its
schema is current (see ``bench/cli_startup.py``).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from shared.chat.address import ChatAddress
from shared.cli.chat import CLI_CHANNEL
from shared.private_files import not_dumpable, private_umask
from shared.queue.core import QueueError
from shared.runtime import Runtime, open_runtime
from shared.settings import api_token
from shared.settings.model import SettingsError, default_home, load_settings
from shared.settings.starter import write_starter_settings
from shared.storage.db import lock_wait_limit
from shared.storage.errors import StorageProblem, storage_problem

app = typer.Typer(
    name="agentpost",
    help="Run AI coding agents from chat: one durable queue, a processor, and channel adapters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
queue_app = typer.Typer(help="Inspect the message queue.", no_args_is_help=True)
dead_app = typer.Typer(help="List, retry and delete dead letters.", no_args_is_help=True)
app.add_typer(queue_app, name="queue")
app.add_typer(dead_app, name="dead")

console = Console(soft_wrap=True)
err_console = Console(stderr=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]

#: Exit status when the database refuses for now (locked, disk full, read-only, server away): sysexits'
#: EX_TEMPFAIL, so a script can tell "try again later" from a real error.
EXIT_STORAGE = 75
#: How long a command waits for a lock another process holds before it says so (the processor's own
#: writes take milliseconds; a lock held longer than this is someone else's long job).
CLI_LOCK_WAIT_MS = 5_000


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print an error in red, on one line whatever the terminal width, and return the exit to raise."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def storage_failure(problem: StorageProblem) -> typer.Exit:
    """The one-line refusal for storage trouble: its cause and the database file, no traceback."""
    return fail(problem.describe(), EXIT_STORAGE)


def _configured_database_url() -> str | None:
    # Only to name the database in a message about it; a broken settings file has its own error.
    try:
        return load_settings().database_url
    except Exception:
        return None


@app.callback()
def _main(
    home: Annotated[
        Path | None,
        typer.Option("--home", envvar="AGENTPOST_HOME", help="agentpost's folder (default ~/.agentpost)."),
    ] = None,
) -> None:
    if home is not None:
        os.environ["AGENTPOST_HOME"] = str(home.expanduser())


@contextmanager
def runtime() -> Iterator[Runtime]:
    """Open settings, database and queue, turning expected errors into clear messages. A lock held by
    another process is waited for at most :data:`CLI_LOCK_WAIT_MS`, then reported."""
    with lock_wait_limit(CLI_LOCK_WAIT_MS):
        try:
            rt = open_runtime(quick=True)
        except SettingsError as exc:
            raise fail(str(exc), 2) from None
        except Exception as exc:  # a database that cannot be opened is an operator problem, not a traceback
            problem = storage_problem(exc, _configured_database_url())
            if problem is not None:
                raise storage_failure(problem) from None
            raise fail(f"cannot open the database: {exc}", 2) from None
        try:
            yield rt
        except QueueError as exc:
            raise fail(str(exc)) from None
        except Exception as exc:
            problem = storage_problem(exc, rt.db.url)
            if problem is None:
                raise
            raise storage_failure(problem) from None
        finally:
            rt.close()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


@app.command()
def init(force: Annotated[bool, typer.Option(help="Overwrite an existing settings file.")] = False) -> None:
    """Write a commented starter settings.toml with one default agent, and create the database."""
    home = default_home()
    try:
        path = write_starter_settings(home, force=force)
    except SettingsError as exc:
        raise fail(str(exc)) from None
    with runtime() as rt:
        console.print(f"wrote [bold]{path}[/]")
        console.print(f"database: {rt.settings.database_url}")
        try:
            token = api_token.ensure(rt.settings)
        except SettingsError as exc:
            raise fail(str(exc)) from None
        if token.source is api_token.Source.FILE:
            # The web API asks for it on loopback too; `agentpost up` prints the dashboard's sign-in link.
            console.print(
                f"API token: {token.path} (only you can read it; `agentpost token` shows how to use it)"
            )


@app.command()
def send(
    text: Annotated[str, typer.Argument(help="The message. '@agent ...' or '@team ...' routes it.")],
    agent: Annotated[str | None, typer.Option(help="Send to this agent or team.")] = None,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait for the reply, showing the agent's progress.")
    ] = False,
    timeout: Annotated[
        float, typer.Option(min=1, help="With --wait: give up waiting after this many seconds.")
    ] = 1800,
    as_json: JsonFlag = False,
    channel: Annotated[str, typer.Option(help="Channel to reply on.")] = CLI_CHANNEL,
    sender: Annotated[str, typer.Option(help="Sender name.")] = "cli",
    sender_id: Annotated[str, typer.Option(help="Sender id on the channel.")] = "",
    conversation: Annotated[str, typer.Option(help="Conversation (chat) address to reply to.")] = "",
    message_id: Annotated[
        str | None, typer.Option("--id", help="Use this message id (prefix_xxxxxxxx).")
    ] = None,
) -> None:
    """Queue a message and print its id; with --wait, print the reply when it comes.

    With --wait, replies to earlier messages of the chat that arrive meanwhile are printed too, each
    under a line "earlier reply to …". When no processor is running (none started, or it refused its
    settings) the wait says so after 5 s, in one line, and keeps waiting: a processor started later
    still answers. The exit status is 1 when the message ended in an error (the explanation is
    printed), 2 when the wait ran out and 130 after Ctrl-C (the reply then waits for `agentpost replies`).
    """
    if wait and channel != CLI_CHANNEL:
        raise fail("--wait reads replies of the cli channel; leave out --channel", 2)
    with runtime() as rt:
        cursor = rt.events.last_cursor()
        result = rt.queue.intake.enqueue_message(
            ChatAddress(channel, sender, sender_id=sender_id, conversation=conversation),
            text,
            agent=agent,
            message_id=message_id,
        )
        if result.duplicate:
            raise fail(f"message id {result.message_id} is already queued; nothing was added")
        if not wait:
            if as_json:
                print_json({"message_id": result.message_id, "agent": result.agent})
            else:
                print(result.message_id)
            return
        from shared.cli.talk import Printer, wait_and_print

        printer = Printer(err_console if as_json else console)
        outcome = wait_and_print(
            rt, printer, result.message_id, conversation, after_cursor=cursor, timeout=timeout
        )
    if as_json:
        from shared.cli.talk import reply_json

        print_json(
            {
                "message_id": result.message_id,
                "agent": result.agent,
                "status": outcome.status,
                "replies": [reply_json(r) for r in outcome.replies],
                "earlier_replies": [reply_json(r) for r in outcome.earlier],
            }
        )
    if outcome.status in ("waiting", "interrupted"):
        raise typer.Exit(2 if outcome.status == "waiting" else 130)
    if outcome.failed:
        raise typer.Exit(1)


@app.command()
def chat(
    agent: Annotated[str | None, typer.Option(help="Talk to this agent or team.")] = None,
    conversation: Annotated[str, typer.Option(help="Which CLI conversation to continue.")] = "",
    timeout: Annotated[
        float, typer.Option(min=1, help="Give up waiting for one reply after this long.")
    ] = 1800,
) -> None:
    """Talk with an agent in the terminal: each line is a message; replies render as Markdown.

    /status, /retry, /stop, /reset and /help work as in the other channels. The exit status is 1 when a
    message ended in an error and 130 after Ctrl-C during a wait (the reply then waits for
    `agentpost replies`)."""
    from shared.cli.talk import Printer, chat_loop

    with runtime() as rt:
        code = chat_loop(
            rt,
            Printer(console),
            conversation,
            sender="cli",
            agent=agent,
            timeout=timeout,
            history=rt.settings.home / "chat_history",
        )
    if code:
        raise typer.Exit(code)


@app.command()
def replies(
    conversation: Annotated[str, typer.Option(help="Which CLI conversation to read.")] = "",
    as_json: JsonFlag = False,
) -> None:
    """Show the CLI replies that arrived while nobody was waiting, and mark them read."""
    from shared.cli.talk import Printer, show_unread

    with runtime() as rt:
        show_unread(rt, Printer(console), conversation, as_json=as_json)


def list_table(title: str, columns: list[tuple[str, list[str], str]], width: int | None = None) -> list[str]:
    """Lines of a table that fits ``width`` (the terminal's; 80 columns too) without cutting an id.

    Each column is ``(header, cells, kind)``: ``id`` columns always show their whole values, ``num``
    columns are right-aligned, ``text`` columns share what width is left and are shortened with "…".
    When too little is left for the text, it goes on an indented line of its own below each row."""
    width = width or console.width
    gap = "  "
    fixed = [(h, c, k) for h, c, k in columns if k != "text"]
    texts = [(h, c, k) for h, c, k in columns if k == "text"]
    widths = {h: max([len(h), *(len(x) for x in c)]) for h, c, _k in fixed}
    used = sum(widths.values()) + len(gap) * (len(fixed) - 1)
    left = width - used - len(gap) * len(texts)
    inline = bool(texts) and left >= 12 * len(texts)
    if inline:
        for h, c, _k in texts:
            widths[h] = max(len(h), min(max(len(x) for x in c) if c else 0, left // len(texts)))

    def cut(text: str, room: int) -> str:
        text = " ".join(text.split())
        return text if len(text) <= room else text[: max(0, room - 1)] + "…"

    def line(cells: list[tuple[str, str, str]]) -> str:
        parts = []
        for header, cell, kind in cells:
            w = widths[header]
            parts.append(cell.rjust(w) if kind == "num" else cut(cell, w).ljust(w))
        return gap.join(parts).rstrip()

    shown = columns if inline else fixed
    lines = [title, line([(h, h, "id") for h, _c, _k in shown])]
    for i in range(len(columns[0][1])):
        lines.append(line([(h, c[i], k) for h, c, k in shown]))
        if not inline:
            lines.extend("    " + cut(f"{h}: {c[i]}", width - 4) for h, c, _k in texts if c[i].strip())
    return lines


def print_lines(lines: list[str]) -> None:
    for text in lines:
        sys.stdout.write(text + "\n")


@queue_app.command("status")
def queue_status(as_json: JsonFlag = False) -> None:
    """Message counts per status (completed: in the last 24 hours), and responses waiting for delivery."""
    with runtime() as rt:
        status = rt.queue.admin.queue_status()
    if as_json:
        print_json(status)
        return
    print_lines(
        list_table(
            "queue", [("status", list(status), "id"), ("count", [str(v) for v in status.values()], "num")]
        )
    )


@queue_app.command("agents")
def queue_agents(as_json: JsonFlag = False) -> None:
    """Pending and processing messages per agent."""
    with runtime() as rt:
        depths = rt.queue.admin.agent_queue_depths()
    if as_json:
        print_json(depths)
        return
    print_lines(
        list_table(
            "agents",
            [
                ("agent", [str(r["agent"]) for r in depths], "id"),
                ("pending", [str(r["pending"]) for r in depths], "num"),
                ("processing", [str(r["processing"]) for r in depths], "num"),
            ],
        )
    )


@app.command("usage")
def usage(
    by: Annotated[str, typer.Option("--by", help="Group by agent, sender, chat or day.")] = "agent",
    since: Annotated[
        str, typer.Option("--since", help="How far back: 30m, 24h, 7d, 2w, today, month, all.")
    ] = "7d",
    as_json: JsonFlag = False,
) -> None:
    """Tokens and cost of agent runs, per agent, sender, chat or day (as the claude CLI reported them)."""
    from shared.reads.usage import USAGE_BY, parse_since, usage_rows

    if by not in USAGE_BY:
        raise fail(f"cannot group by {by!r}; use one of: {', '.join(USAGE_BY)}", 2)
    try:
        since_ms = parse_since(since)
    except ValueError as exc:
        raise fail(str(exc), 2) from None
    with runtime() as rt:
        rows = usage_rows(rt.db, by, since_ms)
    if as_json:
        print_json([r.as_dict() for r in rows])
        return
    if not rows:
        span = {"all": "yet", "today": "today", "month": "this month"}.get(since.strip().lower())
        console.print(f"no runs with recorded usage {span or 'in the last ' + since}")
        return
    print_lines(
        list_table(
            f"usage by {by}",
            [
                (by, [r.key or "(no sender)" for r in rows], "id"),
                ("runs", [str(r.runs) for r in rows], "num"),
                ("input", [str(r.input_tokens) for r in rows], "num"),
                ("output", [str(r.output_tokens) for r in rows], "num"),
                ("cache read", [str(r.cache_read_tokens) for r in rows], "num"),
                ("cache write", [str(r.cache_write_tokens) for r in rows], "num"),
                ("cost USD", [f"{r.cost_usd:.4f}" for r in rows], "num"),
            ],
        )
    )


@dead_app.command("list")
def dead_list(
    as_json: JsonFlag = False, limit: Annotated[int, typer.Option(min=1, help="How many to show.")] = 50
) -> None:
    """Dead letters, newest first (`agentpost trace ID` tells one's whole story)."""
    with runtime() as rt:
        dead = rt.queue.admin.list_dead(limit)
    if as_json:
        print_json([m.as_dict() for m in dead])
        return
    if not dead:
        console.print("no dead letters")
        return
    print_lines(
        list_table(
            "dead letters",
            [
                ("#", [str(m.id) for m in dead], "num"),
                ("message id", [m.message_id for m in dead], "id"),
                ("agent", [m.agent for m in dead], "id"),
                ("tries", [str(m.retry_count) for m in dead], "num"),
                ("retried", [str(m.manual_retries) for m in dead], "num"),
                ("last error", [m.last_error or "" for m in dead], "text"),
                ("message", [m.message for m in dead], "text"),
            ],
        )
    )


@dead_app.command("retry")
def dead_retry(ref: Annotated[str, typer.Argument(help="Row id or message id of the dead letter.")]) -> None:
    """Put a dead letter back in the queue (within its manual-retry budget)."""
    with runtime() as rt:
        m = rt.queue.admin.retry_dead(ref)
    console.print(
        f"{m.message_id} is pending again (manual retry {m.manual_retries} of "
        f"{rt.queue.config.manual_retry_budget})"
    )


@dead_app.command("delete")
def dead_delete(ref: Annotated[str, typer.Argument(help="Row id or message id of the dead letter.")]) -> None:
    """Delete a dead letter for good."""
    with runtime() as rt:
        m = rt.queue.admin.delete_dead(ref)
    console.print(f"deleted dead letter {m.message_id}")


@app.command()
def trace(
    message_id: Annotated[str, typer.Argument(help="The message id (prefix_xxxxxxxx).")],
    as_json: JsonFlag = False,
) -> None:
    """Tell one message's whole story from the event log, and why it stands where it stands."""
    from shared.reads.trace import timeline_lines, trace_message

    with runtime() as rt:
        story = trace_message(rt.db, message_id)
    if as_json:
        print_json(story.as_dict())
        return
    for line in timeline_lines(story):
        console.print(escape(line), highlight=False)
    if story.message is None and not story.events:
        raise typer.Exit(1)


@app.command()
def doctor(as_json: JsonFlag = False) -> None:
    """Check settings, database, each agent's CLI and login, channels and security; print what to fix."""
    from shared.cli.doctor import run_checks

    found = run_checks()
    if as_json:
        print_json([c.__dict__ for c in found])
    else:
        marks = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}
        for c in found:
            console.print(
                f"{marks[c.level]} {escape(c.area)}: {escape(c.name)} — {escape(c.detail)}", highlight=False
            )
            if c.fix and c.level != "ok":
                console.print(f"      fix: {escape(c.fix)}", highlight=False)
        fails = sum(c.level == "fail" for c in found)
        warns = sum(c.level == "warn" for c in found)
        console.print(f"{fails} problem(s), {warns} warning(s)")
    if any(c.level == "fail" for c in found):
        raise typer.Exit(1)


def _load(ep: Any) -> Any | None:
    # A plugin that fails to import must not take the whole CLI down with it: say which one and go on.
    try:
        return ep.load()
    except (ImportError, AttributeError) as exc:
        if os.environ.get("AGENTPOST_DEBUG_PLUGINS"):
            err_console.print(
                f"[yellow]warning:[/] plugin {escape(ep.value)} did not load: {escape(str(exc))}"
            )
        return None


def _process_kinds() -> dict[str, tuple[bool, Any]]:
    """Installed process kinds by name: ``(is_channel, entry point)``. Nothing is imported: a process
    loads only its own code, so a restart is not slowed by every other process's imports."""
    from importlib.metadata import entry_points

    kinds: dict[str, tuple[bool, Any]] = {}
    for ep in entry_points(group="agentpost.processes"):
        kinds.setdefault(ep.name, (False, ep))
    for ep in entry_points(group="agentpost.channels"):
        kinds.setdefault(ep.name, (True, ep))
    return kinds


def _channel_runner() -> Any:
    """The function that runs a channel plugin's class until a signal (``agentpost.channel_runner``)."""
    from importlib.metadata import entry_points

    found = list(entry_points(group="agentpost.channel_runner", name="run"))
    if not found:
        raise fail("the channel runner is not installed (reinstall agentpost)", 1)
    return found[0].load()


@app.command("run")
def run(
    kind: Annotated[str, typer.Argument(help="Which process: processor, web, scheduler or a channel.")],
) -> None:
    """Run one agentpost process in the foreground (systemd and supervisor call this)."""
    kinds = _process_kinds()
    if kind not in kinds:
        known = ", ".join(sorted(kinds)) or "none installed"
        raise fail(f"unknown process kind {kind!r} (available: {known})", 2)
    is_channel, ep = kinds[kind]
    # `kill -USR1 PID` writes every thread's stack to the log: what a process that will not stop is doing.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        target = ep.load()
    except (ImportError, AttributeError) as exc:
        raise fail(
            f"the {kind} process is installed but its code did not load ({ep.value}): {exc}", 1
        ) from None
    try:
        if is_channel:
            _channel_runner()(target, None)
        else:
            target(None)
    except SettingsError as exc:
        raise fail(str(exc), 2) from None
    except KeyboardInterrupt:
        pass


#: Commands of this module that no plugin adds to: running one needs no plugin loaded.
CORE_COMMANDS = frozenset({"send", "chat", "replies", "trace", "dead", "init", "run", "doctor", "usage"})
#: Groups that plugins add to, and their subcommands defined here.
CORE_SUBCOMMANDS = {"queue": frozenset({"status", "agents"})}


def _needs_plugins(argv: list[str]) -> bool:
    """False when the command line names a core command (plugins only add other commands and groups)."""
    words: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--home":
            next(args, None)
        elif not arg.startswith("-"):
            words.append(arg)
            if len(words) == 2:
                break
    if not words:
        return True  # no command: the help lists every command
    if words[0] in CORE_COMMANDS:
        return False
    sub = CORE_SUBCOMMANDS.get(words[0])
    return sub is None or len(words) < 2 or words[1] not in sub


def _load_plugins() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group="agentpost.commands"):
        register = _load(ep)
        if register is not None:
            register(app)


def main() -> None:
    """Console-script entry point."""
    # Chat content, tokens and uploads: nothing any agentpost process creates is for other users.
    private_umask()
    # Tokens and secrets sit in this process's environment and memory: no other process of the same user
    # (an agent's command, where no sandbox can be had) may read them through /proc or a debugger.
    not_dumpable()
    if _needs_plugins(sys.argv[1:]):
        _load_plugins()
    try:
        app()
    except Exception as exc:
        # Commands that open the database their own way (plugins, doctor, run): storage trouble is still a
        # one-line answer, not a traceback. Anything else is a bug and keeps its traceback.
        problem = storage_problem(exc, _configured_database_url())
        if problem is None:
            raise
        err_console.print(
            f"[bold red]error:[/] {escape(problem.describe())}", highlight=False, soft_wrap=True
        )
        sys.exit(EXIT_STORAGE)


if __name__ == "__main__":
    main()
