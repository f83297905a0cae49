"""The ``agentpost`` command. Core commands live here; process kinds, channels and extra command groups
are found through entry points, so ``shared`` never imports ``workers``, ``adapters`` or ``scheduler``:

- ``agentpost.processes``: ``name = "module:function"``, ``function(runtime_home: Path | None) -> None``
  runs one process kind in the foreground (``agentpost run NAME``);
- ``agentpost.channels``: channel plugin classes; ``agentpost run NAME`` calls ``cls.run_process(home)``;
- ``agentpost.commands``: ``register(app: typer.Typer) -> None`` adds commands or groups.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shared.cli_chat import CLI_CHANNEL
from shared.cli_talk import Printer, chat_loop, reply_json, show_unread, wait_and_print
from shared.db import lock_wait_limit
from shared.private_files import private_umask
from shared.queue import QueueError
from shared.runtime import Runtime, open_runtime
from shared.settings import SettingsError, default_home, load_settings, write_starter_settings
from shared.storage_errors import StorageProblem, storage_problem

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
            rt = open_runtime()
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

    With --wait the exit status is 1 when the message ended in an error (the explanation is printed) and
    2 when the wait ran out (the reply then waits for `agentpost replies`).
    """
    if wait and channel != CLI_CHANNEL:
        raise fail("--wait reads replies of the cli channel; leave out --channel", 2)
    with runtime() as rt:
        cursor = rt.events.last_cursor()
        result = rt.queue.enqueue_message(
            channel,
            sender,
            text,
            sender_id=sender_id,
            agent=agent,
            conversation=conversation,
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
        printer = Printer(err_console if as_json else console)
        outcome = wait_and_print(
            rt, printer, result.message_id, conversation, after_cursor=cursor, timeout=timeout
        )
    if as_json:
        print_json(
            {
                "message_id": result.message_id,
                "agent": result.agent,
                "status": outcome.status,
                "replies": [reply_json(r) for r in outcome.replies],
            }
        )
    if outcome.status == "waiting":
        raise typer.Exit(2)
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
    """Talk with an agent in the terminal: each line is a message; replies render as Markdown."""
    with runtime() as rt:
        failures = chat_loop(
            rt,
            Printer(console),
            conversation,
            sender="cli",
            agent=agent,
            timeout=timeout,
            history=rt.settings.home / "chat_history",
        )
    if failures:
        raise typer.Exit(1)


@app.command()
def replies(
    conversation: Annotated[str, typer.Option(help="Which CLI conversation to read.")] = "",
    as_json: JsonFlag = False,
) -> None:
    """Show the CLI replies that arrived while nobody was waiting, and mark them read."""
    with runtime() as rt:
        show_unread(rt, Printer(console), conversation, as_json=as_json)


@queue_app.command("status")
def queue_status(as_json: JsonFlag = False) -> None:
    """Message counts per status, and responses waiting for delivery."""
    with runtime() as rt:
        status = rt.queue.queue_status()
    if as_json:
        print_json(status)
        return
    table = Table("status", "count", title="queue")
    for key, value in status.items():
        table.add_row(key, str(value))
    console.print(table)


@queue_app.command("agents")
def queue_agents(as_json: JsonFlag = False) -> None:
    """Pending and processing messages per agent."""
    with runtime() as rt:
        depths = rt.queue.agent_queue_depths()
    if as_json:
        print_json(depths)
        return
    table = Table("agent", "pending", "processing", title="agents")
    for row in depths:
        table.add_row(row["agent"], str(row["pending"]), str(row["processing"]))
    console.print(table)


@dead_app.command("list")
def dead_list(
    as_json: JsonFlag = False, limit: Annotated[int, typer.Option(min=1, help="How many to show.")] = 50
) -> None:
    """Dead letters, newest first."""
    with runtime() as rt:
        dead = rt.queue.list_dead(limit)
    if as_json:
        print_json([m.as_dict() for m in dead])
        return
    if not dead:
        console.print("no dead letters")
        return
    table = Table(
        "id", "message id", "agent", "attempts", "retried", "last error", "message", title="dead letters"
    )
    for m in dead:
        table.add_row(
            str(m.id),
            m.message_id,
            m.agent,
            str(m.retry_count),
            str(m.manual_retries),
            (m.last_error or "")[:60],
            m.message[:40],
        )
    console.print(table)


@dead_app.command("retry")
def dead_retry(ref: Annotated[str, typer.Argument(help="Row id or message id of the dead letter.")]) -> None:
    """Put a dead letter back in the queue (within its manual-retry budget)."""
    with runtime() as rt:
        m = rt.queue.retry_dead(ref)
    console.print(
        f"{m.message_id} is pending again (manual retry {m.manual_retries} of "
        f"{rt.queue.config.manual_retry_budget})"
    )


@dead_app.command("delete")
def dead_delete(ref: Annotated[str, typer.Argument(help="Row id or message id of the dead letter.")]) -> None:
    """Delete a dead letter for good."""
    with runtime() as rt:
        m = rt.queue.delete_dead(ref)
    console.print(f"deleted dead letter {m.message_id}")


@app.command()
def trace(
    message_id: Annotated[str, typer.Argument(help="The message id (prefix_xxxxxxxx).")],
    as_json: JsonFlag = False,
) -> None:
    """Tell one message's whole story from the event log, and why it stands where it stands."""
    from shared.trace import timeline_lines, trace_message

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
    from shared.doctor import run_checks

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


def _process_kinds() -> dict[str, Callable[[Path | None], None]]:
    kinds: dict[str, Callable[[Path | None], None]] = {}
    for ep in entry_points(group="agentpost.processes"):
        target = _load(ep)
        if target is not None:
            kinds[ep.name] = target
    for ep in entry_points(group="agentpost.channels"):
        if ep.name not in kinds and _load(ep) is not None:
            kinds[ep.name] = _channel_runner(ep.name, ep.load)
    return kinds


def _channel_runner(name: str, load: Callable[[], Any]) -> Callable[[Path | None], None]:
    def run(home: Path | None) -> None:
        load().run_process(home)

    run.__doc__ = f"channel adapter {name}"
    return run


@app.command("run")
def run(
    kind: Annotated[str, typer.Argument(help="Which process: processor, web, scheduler or a channel.")],
) -> None:
    """Run one agentpost process in the foreground (systemd and supervisor call this)."""
    kinds = _process_kinds()
    if kind not in kinds:
        known = ", ".join(sorted(kinds)) or "none installed"
        raise fail(f"unknown process kind {kind!r} (available: {known})", 2)
    try:
        kinds[kind](None)
    except SettingsError as exc:
        raise fail(str(exc), 2) from None
    except KeyboardInterrupt:
        pass


def _load_plugins() -> None:
    for ep in entry_points(group="agentpost.commands"):
        register = _load(ep)
        if register is not None:
            register(app)


def main() -> None:
    """Console-script entry point."""
    # Chat content, tokens and uploads: nothing any agentpost process creates is for other users.
    private_umask()
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
