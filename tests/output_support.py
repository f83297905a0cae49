"""What one big run's output costs: a processor process, one agent printing a lot, the growth measured.

:func:`measure` writes a SQLite home with one agent, starts ``agentpost run processor`` for it as its own
process, answers a small message first (so the code paths and caches a run needs are in place), then sends
the message whose answer is big and measures, from outside:

- the processor's memory growth: its peak resident set (``VmHWM`` in ``/proc/<pid>/status``, reset with
  ``/proc/<pid>/clear_refs`` after the first run) minus its resident set before the big run;
- the database's growth: its size (pages in use after a WAL checkpoint), the ``events`` rows and their
  payload bytes, the response's text.

The agents: a ``command`` agent printing ``size`` bytes as one line (``one_line``) or as lines of 100 bytes
(``many_lines``), or the real claude CLI against the fake Messages API streaming ``size`` characters
(``claude``). Used by ``bench/big_output.py`` and the tests of ``tests/e2e/test_big_output.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.chat.address import ChatAddress
from tests.homes import build_home, open_home
from tests.probes import wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
MB = 1_000_000

#: A command agent that prints SIZE bytes of text: as one line (``one``) or as lines of 100 bytes.
PRINTER = r"""
import sys
words = "the quick brown fox jumps over the lazy dog; "
prompt = sys.stdin.read()
if "small" in prompt:
    print("fine, thanks")
    sys.exit(0)
size, shape = int(sys.argv[1]), sys.argv[2]
out = sys.stdout
if shape == "one":
    block = words * (65536 // len(words))
    left = size - 1
    while left > 0:
        out.write(block[:left])
        left -= len(block)
    out.write("\n")
else:
    line = (words * 3)[:99] + "\n"
    for _ in range(size // 100):
        out.write(line)
out.flush()
"""


@dataclass(frozen=True)
class Growth:
    """What one big run cost (see the module docstring)."""

    case: str
    output_bytes: int
    rss_mb: float  # the processor's peak memory growth
    db_mb: float  # the database's growth (pages in use)
    event_rows: int
    event_mb: float  # bytes of the new events' payloads
    response_chars: int  # the reply's text as queued
    files: list[str]  # what the reply attaches
    seconds: float  # from the big message's enqueue to its reply
    reply: str = ""  # the reply's text
    progress: tuple[str, ...] = ()  # the texts of the run's agent_progress events

    def row(self) -> str:
        return (
            f"| {self.case} | {self.output_bytes / MB:.0f} MB | {self.rss_mb:.1f} MB | {self.db_mb:.2f} MB "
            f"| {self.event_rows:,} | {self.event_mb:.2f} MB | {self.response_chars:,} | {len(self.files)} "
            f"| {self.seconds:.1f} s |"
        )


HEADER = (
    "| case | output | processor memory growth | database growth | event rows | event payloads "
    "| reply characters | files | time |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def _status(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _db_state(path: Path) -> tuple[int, int, int]:
    """Bytes in use by the database (after a checkpoint), event rows and their payload bytes."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = (
            db.execute("PRAGMA page_count").fetchone()[0] - db.execute("PRAGMA freelist_count").fetchone()[0]
        )
        size = pages * db.execute("PRAGMA page_size").fetchone()[0]
        rows, payload = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM events"
        ).fetchone()
    return int(size), int(rows), int(payload)


@contextlib.contextmanager
def _processor(home: Path, env: Mapping[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "shared.cli.main", "run", "processor"],
            cwd=REPO_ROOT,
            env={**env, "AGENTPOST_HOME": str(home), "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def measure(case: str, tmp: Path, size: int = 20 * MB, *, api_url: str | None = None) -> Growth:
    """Run one big output through a processor process and measure it (see the module docstring)."""
    env: dict[str, str] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp)}
    if case == "claude":
        from tests.fakes.claude_env import claude_binary, claude_env

        assert api_url is not None
        user_home = tmp / "user-home"
        user_home.mkdir(exist_ok=True)
        env = {**claude_env(api_url, user_home, max_retries=0), "AGENTPOST_CLAUDE_BIN": str(claude_binary())}
        agent: dict[str, Any] = {"provider": "claude", "timeout_seconds": 300}
    else:
        script = tmp / "printer.py"
        script.write_text(PRINTER)
        shape = "one" if case == "one_line" else "many"
        agent = {
            "provider": "command",
            "command": [sys.executable, str(script), str(size), shape],
            "timeout_seconds": 300,
        }
    home = build_home(tmp, None, {"big": agent}, processor={"sandbox": "none"}, folder=f"home-{case}")
    db_path = home / "agentpost.db"
    chat = ChatAddress("telegram", "ann", sender_id="42", conversation="c1")
    with open_home(home) as rt, _processor(home, env, tmp / f"processor-{case}.log") as proc:

        def replies() -> int:
            return int(rt.db.read("SELECT COUNT(*) AS n FROM responses")[0]["n"])

        rt.queue.intake.enqueue_message(chat, "small talk: how are you")
        wait_for(lambda: replies() >= 1, timeout=120, what="the first reply")
        db_before, rows_before, payload_before = _db_state(db_path)
        rss_before = _status(proc.pid, "VmRSS")
        Path(f"/proc/{proc.pid}/clear_refs").write_text("5")  # the peak starts again from here
        started = time.monotonic()
        sent = rt.queue.intake.enqueue_message(chat, "the big one, please")

        def done() -> bool:
            found = rt.queue.admin.get_message(sent.message_id)
            return found is not None and found.status in ("completed", "dead") and replies() >= 2

        wait_for(done, timeout=600, what="the big reply")
        seconds = time.monotonic() - started
        peak = _status(proc.pid, "VmHWM")
        response = rt.db.read(
            "SELECT message, files FROM responses WHERE message_id = :m ORDER BY id DESC",
            {"m": sent.message_id},
        )[0]
        progress = rt.db.read(
            "SELECT payload FROM events WHERE type = 'agent_progress' AND message_id = :m ORDER BY id",
            {"m": sent.message_id},
        )
    db_after, rows_after, payload_after = _db_state(db_path)
    return Growth(
        case=case,
        output_bytes=size,
        rss_mb=(peak - rss_before) / MB,
        db_mb=(db_after - db_before) / MB,
        event_rows=rows_after - rows_before,
        event_mb=(payload_after - payload_before) / MB,
        response_chars=len(str(response["message"])),
        files=list(json.loads(response["files"] or "[]")),
        seconds=seconds,
        reply=str(response["message"]),
        progress=tuple(str(json.loads(p["payload"])["text"]) for p in progress),
    )


def printed(size: int, shape: str) -> bytes:
    """What :data:`PRINTER` prints for ``size`` and ``shape`` (``one`` or ``many``)."""
    words = "the quick brown fox jumps over the lazy dog; "
    if shape == "one":
        block = words * (65536 // len(words))
        whole = (block * (size // len(block) + 1))[: size - 1]
        return (whole + "\n").encode()
    return ((words * 3)[:99] + "\n").encode() * (size // 100)
