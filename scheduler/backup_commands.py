"""``agentpost backup FILE`` and ``agentpost restore FILE`` (the copy itself is :mod:`shared.storage.backup`
and :mod:`shared.storage.restore`), and doctor's word on backups (the ``agentpost.doctor`` entry point)."""

from __future__ import annotations

import sys
import xmlrpc.client
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from scheduler import backups, supervise
from shared.cli.doctor import Check
from shared.cli.main import console, err_console, fail
from shared.clock import now_ms
from shared.queue import presence
from shared.settings.model import Settings, SettingsError, load_settings
from shared.storage.backup import (
    BackupError,
    Counts,
    Progress,
    check_destination,
    database_counts,
    human_size,
    take_backup,
)
from shared.storage.backup_record import BackupRecord, record_backup
from shared.storage.copy_db import live_holders
from shared.storage.db import SCHEMA_VERSION, Database
from shared.storage.restore import CopyInfo, check_fits, inspect_copy, restore_copy
from shared.storage.schema import open_database

#: supervisord states of a process that is (or is about to be) running.
_LIVE_STATES = frozenset({"RUNNING", "STARTING", "BACKOFF", "STOPPING"})


def _settings() -> Settings:
    try:
        return load_settings()
    except SettingsError as exc:
        raise fail(str(exc), 2) from None


def _open(settings: Settings, *, create: bool) -> Database:
    try:
        return open_database(
            settings.database_url, busy_timeout_ms=settings.file.database.busy_timeout_ms, create=create
        )
    except Exception as exc:
        raise fail(
            f"cannot open the database {settings.database_url}: {' '.join(str(exc).split())}", 2
        ) from None


class _ProgressLine:
    """One progress line on stderr: rewritten in place on a terminal, a line per quarter otherwise."""

    def __init__(self, verb: str) -> None:
        self.verb = verb
        self.tty = sys.stderr.isatty()
        self.shown = -1

    def __call__(self, p: Progress) -> None:
        text = f"{self.verb}: {p.done}/{p.total} {p.unit} ({p.percent}%)" + (f" {p.note}" if p.note else "")
        if self.tty:
            sys.stderr.write("\r" + text[:200].ljust(60))
            sys.stderr.flush()
        elif p.percent // 25 != self.shown // 25 or (p.done == p.total and p.percent != self.shown):
            err_console.print(text, highlight=False, soft_wrap=True)
        self.shown = p.percent

    def end(self) -> None:
        if self.tty and self.shown >= 0:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _print_counts(counts: Counts, indent: str = "  ") -> None:
    for line in counts.lines():
        console.print(f"{indent}{line}", highlight=False)


def backup_command(
    file: Annotated[
        Path, typer.Argument(help="The file to write, e.g. ~/agentpost-2026-12-06.db (.dump on PostgreSQL).")
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace FILE if it exists.")] = False,
) -> None:
    """Copy the live database to FILE while every process keeps working: SQLite's online backup, or
    pg_dump's custom format on PostgreSQL. Prints what the copy holds and its size."""
    settings = _settings()
    try:
        check_destination(file, force=force)  # a wrong name is no failed backup: nothing is recorded
    except BackupError as exc:
        raise fail(str(exc)) from None
    db = _open(settings, create=False)
    try:
        holds = database_counts(db)
    except Exception as exc:
        db.close()
        raise fail(
            f"cannot read the database {settings.database_url}: {' '.join(str(exc).split())}"
        ) from None
    if holds is None:
        db.close()
        raise fail(f"there is no agentpost database at {settings.database_url} yet: nothing to back up")
    line = _ProgressLine("copying")
    try:
        result = take_backup(db, file, force=force, progress=line)
    except BackupError as exc:
        line.end()
        record_backup(db, BackupRecord(at=now_ms(), ok=False, file=str(file), error=str(exc)))
        db.close()
        raise fail(str(exc)) from None
    line.end()
    record_backup(
        db,
        BackupRecord(at=now_ms(), ok=True, file=str(result.path), size=result.size, seconds=result.seconds),
    )
    db.close()
    console.print(
        f"backup written: {escape(str(result.path))} ({human_size(result.size)}, {result.seconds:.1f} s); it holds:",
        highlight=False,
    )
    _print_counts(result.counts)
    console.print(f"restore it with: agentpost restore {escape(str(result.path))}", highlight=False)


def running_against(settings: Settings, db: Database | None) -> list[str]:
    """The agentpost processes that use this home's database right now, as far as can be told: those
    supervisord runs for this home, processors that keep a presence row, and holders of live leases."""
    found: list[str] = []
    p = supervise.paths(settings.home)
    try:
        if supervise.is_running(p):
            for s in supervise.process_info(p):
                if s.get("statename") in _LIVE_STATES:
                    found.append(f"{s['name']} (pid {s.get('pid') or '?'}, under `agentpost up`)")
    except (OSError, xmlrpc.client.Error):
        pass
    if db is not None:
        try:
            workers = presence.present(db)
            holders = live_holders(db)
        except Exception:  # a database without agentpost's tables has no processes either
            workers, holders = [], []
        found += [f"processor {w}" for w in workers]
        found += [f"a process holding leases ({h})" for h in holders if h not in workers]
    return found


def restore_command(
    file: Annotated[Path, typer.Argument(help="A backup written by `agentpost backup` (or the scheduler).")],
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Restore over a database that holds data (what is lost is shown first)."
        ),
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="With --force: do not ask before replacing.")
    ] = False,
) -> None:
    """Put a backup back into this home's database: the copy is checked first (integrity, and the agentpost
    version that wrote it: a newer one is refused, an older one upgraded). Only into an empty database,
    or with --force over one with data; never while agentpost processes run against it."""
    settings = _settings()
    try:
        info = inspect_copy(file)
    except BackupError as exc:
        raise fail(str(exc)) from None
    db = _open(settings, create=False)
    try:
        try:
            check_fits(info, db)
        except BackupError as exc:
            raise fail(str(exc)) from None
        _refuse_while_running(settings, db)
        try:
            current = database_counts(db)
        except Exception as exc:
            said = " ".join(str(exc).split())
            hint = "; create it first (createdb), then restore" if "does not exist" in said else ""
            raise fail(f"cannot read the database {settings.database_url}: {said}{hint}") from None
        if current is not None and not current.empty:
            _confirm_loss(settings, current, force=force, yes=yes)
        line = _ProgressLine("restoring")
        try:
            restore_copy(info, db, progress=line)
        except BackupError as exc:
            line.end()
            raise fail(str(exc)) from None
        line.end()
        after = database_counts(db) or Counts()
    finally:
        db.close()
    _report_restore(info, after, settings)


def _refuse_while_running(settings: Settings, db: Database) -> None:
    running = running_against(settings, db)
    if running:
        raise fail(
            "agentpost processes are running against this database: "
            + "; ".join(running)
            + ". Stop them first with `agentpost down` (or systemctl stop agentpost.target), then restore"
        )


def _confirm_loss(settings: Settings, current: Counts, *, force: bool, yes: bool) -> None:
    where = settings.database_url
    if not force:
        err_console.print(f"the database {escape(where)} holds data:", highlight=False)
        for text in current.lines():
            err_console.print(f"  {text}", highlight=False)
        raise fail("restore refused: add --force to replace all of it with the backup (it is lost then)")
    console.print(f"restoring replaces everything in {escape(where)}; this would be lost:", highlight=False)
    _print_counts(current)
    if yes:
        return
    if not sys.stdin.isatty():
        raise fail("nothing was changed: add --yes to confirm without a terminal")
    if not typer.confirm("replace it with the backup?", default=False):
        raise fail("nothing was changed")


def _report_restore(info: CopyInfo, after: Counts, settings: Settings) -> None:
    console.print(f"restored {escape(str(info.path))} into {escape(settings.database_url)}", highlight=False)
    if info.older:
        console.print(
            f"the copy had schema version {info.schema_version}; upgraded in place to {SCHEMA_VERSION}",
            highlight=False,
        )
    console.print("the database now holds:", highlight=False)
    _print_counts(after)
    console.print("start agentpost again with `agentpost up`", highlight=False)


def doctor_checks(settings: Settings) -> list[Check]:
    """Doctor's word on backups: when the newest one was taken, and a warning when it is older than two
    ``[backup] every`` periods, there is none, or the latest failed."""
    try:
        db = open_database(settings.database_url, create=False)
    except Exception:
        return []  # the database check says why
    try:
        level, detail, fix = backups.staleness(db, settings)
    except Exception:
        return []  # no agentpost tables yet: the database check says so
    finally:
        db.close()
    return [Check("database", "backups", "warn" if level == "warn" else "ok", detail, fix)]


def register(app: typer.Typer) -> None:
    """Add `agentpost backup` and `agentpost restore`."""
    app.command("backup")(backup_command)
    app.command("restore")(restore_command)
