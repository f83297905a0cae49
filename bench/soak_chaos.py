"""The moving parts of ``bench/soak.py``: a fake Anthropic API that misbehaves on a schedule, the agentpost
processes kept running as a supervisor would (and SIGKILLed at random), and the two storage faults (the
database going away once, the disk filling once).

Everything here is the tests' own machinery reused: :class:`tests.fakes.anthropic_api.FakeAnthropic` for the
API, ``python -m shared.cli.main run KIND`` for the processes (what ``agentpost run KIND`` runs, as systemd and
supervisord start them), :class:`tests.integration.test_storage_faults.Relay` to take PostgreSQL away from
agentpost's processes only, and :class:`tests.e2e.test_faults_disk_full.FullDisk` to keep a small tmpfs full.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.crash_support import labels_in
from tests.fakes.anthropic_api import (
    ApiError,
    Chunked,
    Computed,
    FakeAnthropic,
    Overloaded,
    Reply,
    last_user_text,
)

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ApiCall:
    """One main request the fake API answered: when, for which labels, how, and how long the model took."""

    serial: int
    at: float
    labels: tuple[str, ...]
    status: int
    model_seconds: float  # the silence and streaming this reply was given (0 for an error)


@dataclass
class ApiMischief:
    """How the fake API misbehaves: the share of 5xx answers, the 529 bursts, and the slow streams."""

    error_rate: float = 0.01
    slow_rate: float = 0.05
    slow_seconds: tuple[float, float] = (6.0, 15.0)
    normal_seconds: tuple[float, float] = (0.2, 1.0)
    bursts: list[tuple[float, float]] = field(default_factory=list)  # (start, end) on time.monotonic()


class ChaosApi:
    """The fake Anthropic API of the soak: each main request answered ``answered <labels> (r<serial>)``,
    streamed in pieces; 1% of them with a 500, every request inside a burst window with a 529, and a share
    of replies streamed slowly (seconds between pieces). The serial tells two runs' replies apart."""

    def __init__(self, mischief: ApiMischief, seed: int) -> None:
        self.mischief = mischief
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._calls: list[ApiCall] = []
        self.fake = FakeAnthropic(default=Computed(self._reply))

    def __enter__(self) -> ChaosApi:
        self.fake.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.fake.stop()

    @property
    def base_url(self) -> str:
        return self.fake.base_url

    def in_burst(self, now: float) -> bool:
        return any(start <= now < end for start, end in self.mischief.bursts)

    def _reply(self, body: dict[str, Any]) -> Reply:
        found = tuple(labels_in(last_user_text(body)))
        now = time.monotonic()
        m = self.mischief
        with self._lock:
            serial = len(self._calls) + 1
            roll = self._rng.random()
            if self.in_burst(now):
                reply: Reply = Overloaded()
                status, seconds = 529, 0.0
            elif roll < m.error_rate:
                reply = ApiError("the fake's 1% server error", status=500, error_type="api_error")
                status, seconds = 500, 0.0
            else:
                low, high = m.slow_seconds if roll < m.error_rate + m.slow_rate else m.normal_seconds
                seconds = self._rng.uniform(low, high)
                parts = ["answered", *(f" {lbl}" for lbl in found), f" (r{serial})"]
                reply = Chunked(parts, interval=seconds / (len(parts) - 1))
                status = 200
            self._calls.append(ApiCall(serial, now, found, status, seconds))
        return reply

    def calls(self) -> list[ApiCall]:
        with self._lock:
            return list(self._calls)


class Supervised:
    """One agentpost process kind (``processor``, ``telegram``, ``discord``, ``scheduler``, ``web``) kept
    running: started as ``agentpost run KIND``, SIGKILLed by :meth:`kill9`, started again after
    ``restart_delay`` seconds as supervisord's ``autorestart`` would."""

    def __init__(self, kind: str, env: Mapping[str, str], log: Path, restart_delay: float = 1.0) -> None:
        self.kind = kind
        self.env = dict(env)
        self.log = log
        self.restart_delay = restart_delay
        self.kills: list[float] = []  # time.monotonic() of each SIGKILL
        self.unplanned_exits: list[int] = []  # exit codes of exits nobody caused (restarted too)
        self.stopped = False
        self.popen: subprocess.Popen[bytes] | None = None
        # One lock over kill-and-restart and the watcher's restart, or both would start a new process.
        self._lock = threading.RLock()
        self.start()

    def start(self) -> None:
        with self._lock, self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "shared.cli.main", "run", self.kind],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill9(self) -> int:
        """SIGKILL the process (its agent CLIs go with it through the orphan guard), wait, restart it."""
        with self._lock:
            assert self.popen is not None
            pid = self.popen.pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.popen.wait(10)
            self.kills.append(time.monotonic())
            time.sleep(self.restart_delay)
            self.start()
            return pid

    def watch(self) -> None:
        """Restart the process if it ended by itself (supervisord would); remember how it ended."""
        with self._lock:
            if self.stopped or self.popen is None or self.popen.poll() is None:
                return
            self.unplanned_exits.append(int(self.popen.returncode))
            time.sleep(self.restart_delay)
            self.start()

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (SIGKILL past ``timeout``) and restart no more."""
        with self._lock:
            self.stopped = True
            if self.popen is None or self.popen.poll() is not None:
                return
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


# -- the database going away ------------------------------------------------------------------------------


def sqlite_exclusive_lock(db_path: Path, seconds: float) -> str:
    """Hold SQLite's write lock for ``seconds`` (``BEGIN EXCLUSIVE``), as a backup tool or a stuck writer
    would: a file database cannot be restarted, so this is its outage. Every writer waits or fails meanwhile
    (in WAL mode readers go on)."""
    conn = sqlite3.connect(db_path, timeout=60, isolation_level=None)
    try:
        started = time.monotonic()
        conn.execute("BEGIN EXCLUSIVE")
        waited = time.monotonic() - started
        time.sleep(seconds)
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    return f"held BEGIN EXCLUSIVE on the SQLite file for {seconds:g} s (took the lock after {waited:.1f} s)"


def pg_outage(relay: Any, direct_url: str, seconds: float) -> str:
    """PostgreSQL restarted, as agentpost's processes see it: the relay they reach the server through
    refuses connections and cuts the open ones, and the server sessions of this database are terminated
    (what a restart does to them), for ``seconds``. Other databases on the shared server are untouched."""
    name = direct_url.rpartition("/")[2]
    relay.close()
    with psycopg.connect(direct_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchall()
    time.sleep(seconds)
    relay.open()
    return f"PostgreSQL away for {seconds:g} s: connections refused, {len(rows)} sessions terminated"


def pg_real_restart() -> str:
    """``pg_ctlcluster restart`` of the machine's server (every database on it, other users' too)."""
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    started = time.monotonic()
    done = subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    if done.returncode != 0:
        return f"pg_ctlcluster restart failed ({done.returncode}): {done.stderr.strip()[:200]}"
    return f"pg_ctlcluster {version} main restart took {took:.1f} s"


# -- the disk filling up ------------------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(mount: Path, size: str) -> Any:
    """A tmpfs of ``size`` at ``mount`` for the agentpost home (root only); yields None when it cannot be
    mounted (the soak then runs without the disk fault and says so)."""
    mount.mkdir(parents=True, exist_ok=True)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if made.returncode != 0:
        yield made.stderr.strip() or "mount failed"
        return
    try:
        yield None
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill_disk(mount: Path, seconds: float) -> str:
    """Fill the tmpfs and keep it full for ``seconds`` (space freed meanwhile is taken again), then free it."""
    from tests.e2e.test_faults_disk_full import FullDisk

    full = FullDisk(mount)
    filled = full.path.stat().st_size
    time.sleep(seconds)
    full.free()
    return f"disk full for {seconds:g} s ({filled / 2**20:.0f} MiB filler on the home's tmpfs)"
