"""Helpers for the scheduler and operations tests: a home folder with settings, the CLI as a subprocess,
waiting on conditions with a deadline, and dead letters made through the real queue operations."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.queue.core import Queue
from shared.runtime import Runtime, open_runtime
from tests.homes import build_home
from tests.probes import free_port, service_unavailable, wait_for  # noqa: F401  (free_port re-exported: tests import it from here)

ADMIN_PG_URL = os.environ.get("AGENTPOST_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
T = TypeVar("T")


def write_home(
    home: Path, db_url: str, extra: str = "", *, agents: str | None = None, queue: str = "max_retries = 1"
) -> Path:
    """A home folder whose settings use ``db_url``; ``agents``, ``queue`` and ``extra`` are TOML text (the
    scheduler tests write their ``[scheduler]``/``[heartbeats]`` tables as the user would)."""
    agents = agents if agents is not None else '[agents.assistant]\nname = "Assistant"\n'
    # Scripted agents report through files the agent sandbox would hide: test homes run them unconfined.
    if "[processor]\n" in extra:
        extra = extra.replace("[processor]\n", '[processor]\nsandbox = "none"\n', 1)
    else:
        extra += '\n[processor]\nsandbox = "none"\n'
    text = f"[queue]\n{queue}\n\n{agents}\n{extra}"
    return build_home(home.parent, db_url, {}, fast=False, folder=home.name, toml=text)


def wait_until(check: Callable[[], T], timeout: float = 20.0, interval: float = 0.05, what: str = "") -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout`` seconds."""
    return wait_for(check, timeout, what or repr(check), interval)


def cli_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a CLI or process run: no chat tokens, no provider login, this home."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AGENTPOST_", "ANTHROPIC_", "TELEGRAM_", "DISCORD_", "WHATSAPP_", "CLAUDE"))
    }
    env.update(
        {
            "AGENTPOST_HOME": str(home),
            "HOME": str(home / "user"),
            "PYTHONUNBUFFERED": "1",
            "NO_COLOR": "1",
            "COLUMNS": "200",
        }
    )
    env.update(extra or {})
    return env


def run_cli(
    home: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 90, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``agentpost ARGS`` as a user would, in its own process."""
    out = subprocess.run(
        [sys.executable, "-m", "shared.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env or cli_env(home)),
    )
    if check and out.returncode != 0:
        raise AssertionError(
            f"agentpost {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
        )
    return out


def start_process(
    home: Path, kind: str, log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``agentpost run KIND`` with its output (stdout and stderr) in ``log``."""
    with open(log, "ab") as f:
        return subprocess.Popen(
            [sys.executable, "-m", "shared.cli.main", "run", kind],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=dict(env or cli_env(home)),
        )


def stop_process(proc: subprocess.Popen[Any], timeout: float = 20) -> int:
    """SIGTERM and wait; returns the exit code (kills it if it does not stop in time)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError("the process did not stop on SIGTERM") from None
    return int(proc.returncode)


def make_dead(queue: Queue, count: int, *, agent: str = "assistant", channel: str = "cli") -> list[str]:
    """``count`` dead letters made the way real ones are: enqueue, claim, fail past ``max_retries``.
    The agent must have no other pending messages (they would be claimed too)."""
    ids = [
        queue.intake.enqueue_message(ChatAddress(channel, "ann"), f"dead letter {i}", agent=agent).message_id
        for i in range(count)
    ]
    worker = "test-worker-" + secrets.token_hex(3)
    claimed = queue.messages.claim_all_pending_messages(agent, worker)
    assert {m.message_id for m in claimed} == set(ids)
    for _ in range(queue.config.max_retries + 1):
        outcome = queue.failures.fail_messages([m.message_id for m in claimed], worker, "provider exploded")
        if len(outcome.dead) == len(claimed):
            break
        with queue.db.transaction() as tx:
            tx.execute("UPDATE messages SET available_at = 0 WHERE status = 'pending'")
        claimed = queue.messages.claim_all_pending_messages(agent, worker)
    queue.leases.release_agent(agent, worker)
    died = now_ms()
    wait_until(
        lambda: now_ms() > died + 1, what="the clock to pass the deaths (archive age 0 means older than now)"
    )
    assert all(queue.admin.get_message(i).status == "dead" for i in ids)  # type: ignore[union-attr]
    return ids


def count(queue: Queue, status: str) -> int:
    return int(queue.db.read_scalar("SELECT COUNT(*) FROM messages WHERE status = :s", {"s": status}) or 0)


@contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new, empty PostgreSQL database on the local server, dropped afterwards."""
    name = f"agentpost_sched_{secrets.token_hex(4)}"
    try:
        with psycopg.connect(ADMIN_PG_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        service_unavailable("PostgreSQL", exc)
    base, _, _ = ADMIN_PG_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(ADMIN_PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def up_home(tmp: Path, timeout: float) -> Iterator[Path]:
    """The body of an ``agentpost up`` test's home fixture: one command agent that answers "done", and
    ``agentpost down`` afterwards (whatever the test left running)."""
    agent = json.dumps([sys.executable, "-c", "import sys; sys.stdin.read(); print('done')"])
    built = write_home(
        tmp / "home",
        f"sqlite:///{tmp / 'home' / 'agentpost.db'}",
        agents=f'[agents.assistant]\nname = "A"\nprovider = "command"\ncommand = {agent}\n',
    )
    yield built
    run_cli(built, "down", env=cli_env(built), check=False, timeout=timeout)


def open_scheduler_runtime(tmp_path: Path, db_url: str, extra: str = "") -> Runtime:
    """A runtime over a fresh scheduler test home (see :func:`write_home`) with ``extra`` settings."""
    return open_runtime(write_home(tmp_path / "home", db_url, extra), env={})


def events_of(rt: Runtime, type_: str) -> list[dict[str, object]]:
    """Every event of ``type_`` in ``rt``'s event log, oldest first, as dicts."""
    return [e.as_dict() for e in rt.events.read(None, None, 10_000) if e.type == type_]


#: A fixed start for scheduler tests that drive time themselves (never now, so no test depends on the clock).
T0 = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
