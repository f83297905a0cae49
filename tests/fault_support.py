"""Helpers for the liveness and fault-injection tests: homes with processor timings, a scripted agent that
leaves a start marker, a fresh PostgreSQL database per test, and *kill points*.

A kill point holds a real process at one exact step of the message lifecycle so a test can SIGKILL it
there, and tells the test (from the database) that the process is waiting at that step. It is a PostgreSQL
trigger on the write that starts the step, which waits for an advisory lock the test holds while the
point is armed (and passes straight through when it is not):

- ``claim``: a message going ``pending → processing`` (the processor, before its claim commits);
- ``run_start``: the ``chain_step_start`` event (the processor, claim committed, CLI not started yet);
- ``delivery``: a response going ``pending → delivering`` (the adapter, before it sends anything).

No code of ours is changed for it; the waiting process is a real one in a real transaction, and a kill
there rolls the transaction back exactly as a crash at that point would.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shared.storage.schema import open_database
from tests.homes import build_home, scripted_agents

ADMIN_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

#: The agent the fault tests run: like tests.channel_support's, and it first writes a marker file
#: ``started-<message id>-<pid>`` next to itself, so a test can tell a run has really begun.
#: ``sleep=S`` waits S seconds on every attempt, ``sleepfirst=S`` only on the first one; ``long=N`` answers
#: with N paragraphs; otherwise it answers with the ``token-*`` words of the prompt.
FAULT_AGENT = r"""
import os, sys, time
marker_dir = os.path.dirname(os.path.abspath(__file__))
mid = os.environ.get("AGENTPOST_MESSAGE_ID", "unknown")
open(os.path.join(marker_dir, f"started-{mid}-{os.getpid()}"), "w").close()
prompt = sys.stdin.read()
agent = os.environ.get("AGENTPOST_AGENT", "?")
words = prompt.split()
first = len([n for n in os.listdir(marker_dir) if n.startswith(f"started-{mid}-")]) == 1
for w in words:
    if w.startswith("sleep=") or (w.startswith("sleepfirst=") and first):
        time.sleep(float(w.split("=", 1)[1]))
out = []
for w in words:
    if w.startswith("long="):
        n = int(w.split("=", 1)[1])
        for i in range(1, n + 1):
            out.append(f"Paragraph {i} of {n}. " + ("lorem ipsum dolor sit amet " * 11).strip() + f" [end {i}]")
if not out:
    tokens = [w for w in words if w.startswith("token-")]
    out.append(f"{agent} answered {' '.join(dict.fromkeys(tokens))}")
print("\n\n".join(out))
"""

KILL_POINTS = {"claim": 7_301, "run_start": 7_302, "delivery": 7_303}

_TRIGGERS = """
CREATE OR REPLACE FUNCTION agentpost_test_hold() RETURNS trigger AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(TG_ARGV[0]::bigint);
  RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS agentpost_test_hold_claim ON messages;
CREATE TRIGGER agentpost_test_hold_claim BEFORE UPDATE ON messages FOR EACH ROW
  WHEN (OLD.status = 'pending' AND NEW.status = 'processing') EXECUTE FUNCTION agentpost_test_hold('{claim}');
DROP TRIGGER IF EXISTS agentpost_test_hold_run_start ON events;
CREATE TRIGGER agentpost_test_hold_run_start BEFORE INSERT ON events FOR EACH ROW
  WHEN (NEW.type = 'chain_step_start') EXECUTE FUNCTION agentpost_test_hold('{run_start}');
DROP TRIGGER IF EXISTS agentpost_test_hold_delivery ON responses;
CREATE TRIGGER agentpost_test_hold_delivery BEFORE UPDATE ON responses FOR EACH ROW
  WHEN (OLD.status = 'pending' AND NEW.status = 'delivering') EXECUTE FUNCTION agentpost_test_hold('{delivery}');
"""


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A PostgreSQL database of its own (the schema created), dropped afterwards. Triggers added by a
    test therefore never reach another test's database."""
    name = f"agentpost_fault_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_PG_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{ADMIN_PG_URL.rpartition('/')[0]}/{name}"
    try:
        open_database(url).close()
        yield url
    finally:
        with psycopg.connect(ADMIN_PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class KillPoints:
    """The kill points of one database (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
        self.conn.execute(_TRIGGERS.format(**KILL_POINTS).encode())
        self.armed: set[str] = set()

    def arm(self, point: str) -> None:
        """Make the next process reaching ``point`` wait there."""
        self.conn.execute("SELECT pg_advisory_lock(%s)", (KILL_POINTS[point],))
        self.armed.add(point)

    def disarm(self, point: str) -> None:
        """Let processes through ``point`` again (a killed one's transaction then rolls back)."""
        if point in self.armed:
            self.conn.execute("SELECT pg_advisory_unlock(%s)", (KILL_POINTS[point],))
            self.armed.discard(point)

    def waiting(self, point: str) -> int:
        """How many database sessions wait at ``point`` now (read from ``pg_locks``)."""
        row = self.conn.execute(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND ((classid::bigint << 32) | objid::bigint) = %s",
            (KILL_POINTS[point],),
        ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        for point in list(self.armed):
            self.disarm(point)
        self.conn.close()


def fault_home(
    tmp: Path,
    db_url: str,
    channels: Mapping[str, Any],
    *,
    processor: Mapping[str, Any] | None = None,
    queue: Mapping[str, Any] | None = None,
    agents: tuple[str, ...] = ("alpha",),
) -> Path:
    """A home like :func:`tests.channel_support.channel_home`, running :data:`FAULT_AGENT`, with extra
    ``[processor]`` settings."""
    script = tmp / "fault_agent.py"
    script.write_text(FAULT_AGENT, encoding="utf-8")
    agent_settings = scripted_agents(script, agents)
    return build_home(tmp, db_url, agent_settings, queue=queue, processor=processor, channels=channels)


def started_runs(tmp: Path, message_id: str) -> list[Path]:
    """The start markers :data:`FAULT_AGENT` left for runs of ``message_id``."""
    return sorted(tmp.glob(f"started-{message_id}-*"))


@contextlib.contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A disk of ``size`` (``"4m"``) to fill: a tmpfs mounted at ``mount`` (made here) for the block, then
    unmounted. Mounting needs root: the test is skipped elsewhere."""
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
