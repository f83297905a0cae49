"""The operator's commands: `agentpost dlq ...`, `agentpost queue audit`, `agentpost migrate`,
`agentpost up`, `agentpost status`, `agentpost restart` and `agentpost down`."""

from __future__ import annotations

import os
import xmlrpc.client
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from scheduler import audit as audit_mod
from scheduler import dlq, process_plan, supervise
from scheduler.config import load_scheduler_config
from scheduler.migrate import MigrationError, migrate
from shared.cli.main import JsonFlag, console, err_console, fail, print_json, queue_app, runtime
from shared.cli.token import token_command
from shared.queue.dlq_restores import restored_keys
from shared.settings import api_token
from shared.settings.model import SettingsError, default_home, load_settings

dlq_app = typer.Typer(
    help="The dead-letter archive: per-day JSONL files under $AGENTPOST_HOME/dlq/.", no_args_is_help=True
)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


@dlq_app.command("status")
def dlq_status(as_json: JsonFlag = False) -> None:
    """Dead letters in the database (count, due for the archive, oldest) and the archive files with sizes."""
    with runtime() as rt:
        config = load_scheduler_config(rt.settings)
        info = dlq.status(rt.db, dlq.dlq_dir(rt.settings), int(config.dlq_archive_age_hours * 3_600_000))
    if as_json:
        print_json(info)
        return
    console.print(
        f"dead letters in the database: [bold]{info['dead_in_database']}[/] "
        f"({info['due_for_archive']} older than the archive age); oldest died {_when(info['oldest_dead_at'])}"
    )
    console.print(
        f"archive: {escape(info['archive_dir'])} — {info['archived_entries']} entries, "
        f"{_size(info['archive_bytes'])}"
    )
    if info["files"]:
        table = Table("file", "entries", "size", "corrupt lines")
        for f in info["files"]:
            table.add_row(f["name"], str(f["entries"]), _size(f["size"]), str(f["corrupt"] or ""))
        console.print(table)


@dlq_app.command("list")
def dlq_list(
    file: Annotated[
        str | None, typer.Argument(help="One archive file (path, name or day YYYY-MM-DD).")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="How many entries to show.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Archived dead letters, newest file first; corrupt lines are reported, not fatal."""
    with runtime() as rt:
        directory = dlq.dlq_dir(rt.settings)
        restored = restored_keys(rt.db)
        try:
            items = list(dlq.iter_entries(directory, file))
        except FileNotFoundError as exc:
            raise fail(str(exc)) from None
    entries = [e for e in items if isinstance(e, dlq.ArchivedEntry)][:limit]
    corrupt = [c for c in items if isinstance(c, dlq.CorruptLine)]
    if as_json:
        print_json(
            {
                "entries": [
                    dict(e.data, file=e.file, line=e.line, restored=e.key in restored) for e in entries
                ],
                "corrupt": [c.__dict__ for c in corrupt],
            }
        )
        return
    for c in corrupt:
        console.print(f"[yellow]corrupt line skipped:[/] {c.file}:{c.line}: {escape(c.error)}")
    if not entries:
        console.print("no archived dead letters")
        return
    table = Table("file", "message id", "agent", "channel", "attempts", "died", "error", "restored")
    for e in entries:
        m = e.data["message"]
        table.add_row(
            e.file,
            e.message_id,
            str(m.get("agent", "")),
            str(m.get("channel", "")),
            str(e.data.get("attempts")),
            _when(e.data.get("died_at")),
            escape(str(e.data.get("error") or "")[:50]),
            "yes" if e.key in restored else "",
        )
    console.print(table)


@dlq_app.command("restore")
def dlq_restore(
    file: Annotated[str, typer.Argument(help="Archive file (path, name or day YYYY-MM-DD).")],
    message_id: Annotated[str | None, typer.Option("--id", help="Restore only this message id.")] = None,
) -> None:
    """Put archived dead letters back into the queue as pending, each at most once."""
    with runtime() as rt:
        try:
            path = dlq.resolve_file(dlq.dlq_dir(rt.settings), file)
            result = dlq.restore(rt.db, rt.settings, path, only=message_id)
        except (FileNotFoundError, LookupError) as exc:
            raise fail(str(exc)) from None
    for c in result.corrupt:
        console.print(f"[yellow]corrupt line skipped:[/] {c.file}:{c.line}: {escape(c.error)}")
    for mid, agent in result.rerouted.items():
        console.print(f"{mid}: its agent no longer exists; restored to {agent}")
    console.print(f"restored {len(result.restored)}: {' '.join(result.restored)}".rstrip(": "))
    if result.already_restored:
        console.print(
            f"already restored before (skipped) {len(result.already_restored)}: "
            f"{' '.join(result.already_restored)}"
        )
    if result.in_queue:
        console.print(f"already in the queue (skipped) {len(result.in_queue)}: {' '.join(result.in_queue)}")


def queue_audit(
    hours: Annotated[float, typer.Option(min=0.01, help="How far back to measure.")] = 24.0,
    as_json: JsonFlag = False,
) -> None:
    """Measured throughput (messages per second by hour, peak, failures, depth) and whether this deployment
    should stay on SQLite or move to PostgreSQL."""
    with runtime() as rt:
        config = load_scheduler_config(rt.settings)
        result = audit_mod.run_audit(
            rt.queue, hours=hours, capacity_per_second=config.audit_sqlite_capacity_per_second
        )
    if as_json:
        print_json(result.as_dict())
        return
    table = Table(
        "hour (UTC)",
        "received",
        "msg/s",
        "completed",
        "failed",
        "dead",
        title=f"throughput, last {hours:g} h ({result.database})",
    )
    for h in result.hours:
        table.add_row(
            h.hour, str(h.received), f"{h.per_second:.3f}", str(h.completed), str(h.failed), str(h.dead)
        )
    console.print(table)
    console.print(
        f"totals: {result.received} received, {result.completed} completed, {result.failed} failed attempts, "
        f"{result.dead} dead letters"
    )
    console.print(
        f"peak: {result.peak_per_second} msg in one second ({result.peak_second_at or '-'}), "
        f"{result.peak_minute_per_second:.2f} msg/s over the busiest minute"
    )
    depth = result.depth
    console.print(
        f"depth now: {depth.get('pending', 0)} pending, {depth.get('processing', 0)} processing, "
        f"{depth.get('dead', 0)} dead, {depth.get('responses_pending', 0)} replies waiting"
        + (
            f"; oldest pending {result.oldest_pending_age_s:g}s"
            if result.oldest_pending_age_s is not None
            else ""
        )
    )
    console.print(f"[bold]{escape(result.verdict)}[/]")


def migrate_command(
    to: Annotated[
        str, typer.Option("--to", help="Target database URL, e.g. postgresql://user@host/agentpost.")
    ],
    no_switch: Annotated[
        bool, typer.Option("--no-switch", help="Copy and verify, but keep settings.toml.")
    ] = False,
    force: Annotated[
        bool, typer.Option(help="Migrate even though workers seem to hold live leases.")
    ] = False,
) -> None:
    """Copy every table to an empty target, verify counts per table and status, then switch database.url."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        raise fail(str(exc), 2) from None
    p = supervise.paths(settings.home)
    if supervise.is_running(p) and not force:
        raise fail("agentpost is running under supervisord; stop it first with `agentpost down`")
    try:
        report = migrate(settings, to, switch=not no_switch, allow_live=force)
    except MigrationError as exc:
        raise fail(f"migration refused: {exc}") from None
    table = Table("table", "rows", title=f"copied {report.source} → {report.target}")
    for name, n in report.tables.items():
        table.add_row(name, str(n))
    console.print(table)
    for name, counts in report.statuses.items():
        if counts:
            console.print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    console.print("verified: every count matches")
    if report.switched:
        console.print(f"switched database.url in {report.settings_path}; the old database was left untouched")
        if report.env_override:
            console.print(
                "[yellow]note:[/] AGENTPOST_DATABASE_URL is set and overrides the file; update it too"
            )
        console.print("start the processes again (agentpost up, or systemctl start agentpost.target)")


def _print_states(states: list[dict[str, Any]]) -> None:
    table = Table("process", "state", "pid", "info")
    for s in states:
        table.add_row(
            s["name"], s["statename"], str(s.get("pid") or ""), escape(str(s.get("description", "")))
        )
    console.print(table)


def up_command() -> None:
    """Start every enabled process under supervisord and wait until each serves; print the dashboard
    address and what is missing. Exits 1, naming the cause, when a process does not start."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        raise fail(str(exc), 2) from None
    settings.home.mkdir(parents=True, exist_ok=True)
    try:
        # Made here when missing (the web process would make it too) so the sign-in link can be printed.
        token = api_token.ensure(settings)
    except SettingsError as exc:
        raise fail(str(exc), 2) from None
    plan = process_plan.plan_processes(settings, os.environ)
    p = supervise.paths(settings.home)
    port = supervise.web_port(settings, os.environ)
    web_port = port if "web" in plan.names else None
    try:
        outcome = supervise.up(p, plan.programs, os.environ, web_port=web_port)
    except supervise.SuperviseError as exc:
        for note in plan.missing:
            console.print(f"  - {escape(note)}")
        raise fail(str(exc)) from None
    if outcome.failed:
        console.print(
            f"agentpost started under supervisord, but not every process is up (config {escape(str(p.conf))}, "
            f"logs {escape(str(p.logs))})"
        )
    else:
        console.print(
            f"agentpost is up under supervisord (config {escape(str(p.conf))}, logs {escape(str(p.logs))})"
        )
    _print_states(outcome.states)
    for name, variables in outcome.env_changed.items():
        if name not in outcome.failed:
            console.print(f"{name}: restarted to take the changed {', '.join(variables)}", highlight=False)
    if "web" not in plan.names:
        console.print("dashboard: not available (the web adapter is not installed)")
    elif outcome.ready("web"):
        console.print(f"dashboard: [bold]http://{settings.api.host}:{port}/[/]")
        _print_sign_in(settings.api.host, port, token)
    if plan.missing or plan.providers:
        console.print("not running, and what to do about it:")
        for note in [*plan.missing, *plan.providers]:
            console.print(f"  - {escape(note)}")
    _report_failed(outcome, p)


def _print_sign_in(host: str, port: int, token: api_token.ApiToken) -> None:
    """The dashboard's sign-in link (it holds the token: a browser that opens it is signed in), or why the
    API asks for none."""
    if not token.required:
        console.print(
            "API: open to every program on this machine, agents included (api.allow_open_loopback); "
            "`agentpost doctor` says how to close it",
            highlight=False,
        )
        return
    link = api_token.sign_in_link(host, port, token.value)
    console.print(f"sign in: [bold]{escape(link)}[/] (opens the dashboard signed in; keep it to yourself)")
    console.print(
        "  `agentpost token` shows it again, and the base URL for TinyAGI's clients", highlight=False
    )


def _report_failed(outcome: supervise.Outcome, p: supervise.Paths) -> None:
    """One line per process that did not start (its cause, stopped), then exit 1."""
    if not outcome.failed:
        return
    for name, cause in outcome.failed.items():
        err_console.print(
            f"[bold red]error:[/] {escape(name)}: {escape(cause)}", highlight=False, soft_wrap=True
        )
    err_console.print(
        f"{'it was' if len(outcome.failed) == 1 else 'they were'} stopped; logs in {escape(str(p.logs))}; "
        "after fixing, run `agentpost up` again",
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(1)


def status_command(as_json: JsonFlag = False) -> None:
    """Show the processes supervisord runs (exit code 3 when agentpost is not up)."""
    p = supervise.paths(default_home())
    channels = _channel_health()
    if not supervise.is_running(p):
        if as_json:
            print_json({"running": False, "processes": [], "channels": channels})
        else:
            console.print("agentpost is not running (start it with `agentpost up`)")
            _print_channels(channels)
        raise typer.Exit(3)
    states = supervise.process_info(p)
    if as_json:
        print_json({"running": True, "processes": states, "channels": channels})
        return
    _print_states(states)
    _print_channels(channels)


def _channel_health() -> list[dict[str, Any]]:
    """Each channel adapter's connection as it last recorded it (adapters also run outside supervisord)."""
    from shared.chat.health import read_from_settings

    try:
        found = read_from_settings(load_settings()) or []
    except SettingsError:
        return []
    return [
        {
            "channel": h.channel,
            "state": "not running" if h.adapter_gone else h.state,
            "error": h.error,
            "attempts": h.attempts,
            "since": h.since,
            "detail": h.describe(),
        }
        for h in found
    ]


def _print_channels(channels: list[dict[str, Any]]) -> None:
    for c in channels:
        console.print(f"{c['channel']}: {escape(str(c['detail']))}", highlight=False)


def down_command() -> None:
    """Stop every process and supervisord."""
    p = supervise.paths(default_home())
    try:
        stopped = supervise.down(p)
    except supervise.SuperviseError as exc:
        raise fail(str(exc)) from None
    console.print("agentpost stopped" if stopped else "agentpost was not running")


def restart_command(
    process: Annotated[
        str | None,
        typer.Argument(help="Which process (processor, web, scheduler, a channel); leave out for all."),
    ] = None,
) -> None:
    """Restart one process, or every process, under the running supervisord (`agentpost up`), with the
    environment the last `agentpost up` passed it, and wait until each is up again."""
    p = supervise.paths(default_home())
    env = supervise.process_env(p, "web", os.environ)
    try:
        web_port: int | None = supervise.web_port(load_settings(p.home, env), env)
    except SettingsError:
        web_port = None  # the web process says what is wrong with them when it starts
    try:
        outcome = supervise.restart(p, process, web_port=web_port)
    except supervise.SuperviseError as exc:
        raise fail(str(exc), 3 if "not running" in str(exc) else 2) from None
    except (OSError, xmlrpc.client.Error) as exc:
        raise fail(f"supervisord did not answer on {p.sock}: {exc}") from None
    console.print(f"restarted {process or 'every process'}")
    _print_states(outcome.states)
    _report_failed(outcome, p)


def register(app: typer.Typer) -> None:
    """Add the scheduler's and the operator's commands to the `agentpost` CLI."""
    app.add_typer(dlq_app, name="dlq")
    queue_app.command("audit")(queue_audit)
    app.command("migrate")(migrate_command)
    app.command("up")(up_command)
    app.command("status")(status_command)
    app.command("down")(down_command)
    app.command("restart")(restart_command)
    # With `up`, which prints the same link: the operator's way back to it.
    app.command("token")(token_command)
