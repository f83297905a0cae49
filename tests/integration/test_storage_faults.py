"""Storage trouble is a clean, temporary refusal: a database locked by another process, a full disk, a
read-only file, PostgreSQL out of reach. The web API answers 503 with ``Retry-After`` and a plain sentence
(never 500, and without waiting out the 30 s busy timeout), the CLI prints one line naming the cause and the
database file (no traceback), nothing accepted before is lost, and the same request succeeds once the trouble
clears — without restarting anything.

How each fault is made real here (tests run as root, where ``chmod 0444`` does not stop a write):

- *locked*: a second ``sqlite3`` connection holding ``BEGIN IMMEDIATE`` on the same file;
- *disk full*: the home folder on a 4 MiB ``tmpfs`` (``mount -t tmpfs``, root only), filled with a file;
- *read-only*: the home folder seen through a read-only bind mount (``mount -o remount,bind,ro``), which
  refuses root's writes too;
- *PostgreSQL unreachable*: the web talks to the server through a small TCP relay that the test shuts (its
  port then refuses connections) and opens again.

Before this change, under a held lock: ``POST /api/message`` answered 500 after 30.1 s, and ``agentpost
send`` waited 31.9 s; after a lock taken once the runtime was open, a disk-full or read-only write, the CLI
printed a ``sqlite3.OperationalError`` traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from websockets.sync.client import connect

from adapters.web.stream import StreamLimits
from shared.chat.address import ChatAddress
from shared.storage.errors import storage_problem
from tests.fault_support import mounted_tmpfs
from tests.probes import free_port
from tests.web_support import (
    AGENTPOST,
    REPO,
    LiveServer,
    SseReader,
    auth_headers,
    make_home,
    runtime_for,
    wait_until,
    web_process,
)

pytestmark = pytest.mark.integration


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    return {**env, "AGENTPOST_HOME": str(home), **extra}


@contextlib.contextmanager
def write_lock(db_file: Path) -> Iterator[None]:
    """Another program holding the database's write lock (as ``sqlite3 file 'BEGIN IMMEDIATE'`` would)."""
    conn = sqlite3.connect(db_file, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def message_ids(db_file: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(db_file)) as conn:
        return [r[0] for r in conn.execute("SELECT message_id FROM messages ORDER BY id")]


def assert_temporary_refusal(r: httpx.Response) -> int:
    """503, a whole-seconds Retry-After, and one plain sentence: no driver names, no traceback."""
    assert r.status_code == 503, r.text
    retry_after = int(r.headers["retry-after"])
    assert retry_after >= 1
    error = r.json()["error"]
    assert "try again" in error
    for internal in ("OperationalError", "sqlite", "Traceback", "psycopg", "errno"):
        assert internal.lower() not in error.lower(), error
    return retry_after


def assert_one_line(stderr: str, *needles: str) -> None:
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


# -- a lock held by another process ----------------------------------------------------------------------
@pytest.mark.e2e
def test_web_answers_503_within_seconds_under_a_held_lock_and_loses_nothing(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    port = free_port()
    db_file = home / "agentpost.db"
    with (
        web_process(home, port) as proc,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth_headers(port), timeout=60) as c,
    ):
        accepted = [
            c.post("/api/message", json={"message": f"before {i}"}).json()["messageId"] for i in range(3)
        ]
        body = {"message": "during the lock", "messageId": "web_lock0001"}
        with write_lock(db_file):
            started = time.monotonic()
            r = c.post("/api/message", json=body)
            took = time.monotonic() - started
            assert_temporary_refusal(r)
            assert took < 8, f"answered after {took:.1f} s: the request waited out the busy timeout"
            # Reads do not need the write lock: the API keeps serving them meanwhile.
            assert c.get("/api/queue/status").status_code == 200
            assert c.get("/healthz").status_code == 200
        assert proc.poll() is None, "the web process must keep running"
        assert message_ids(db_file) == accepted  # the refused message left no trace, nothing was lost
        again = c.post("/api/message", json=body)
        assert again.status_code == 201, again.text
        assert message_ids(db_file) == [*accepted, "web_lock0001"]


@pytest.mark.e2e
def test_cli_under_a_held_lock_prints_one_line_naming_the_file(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    runtime_for(home).close()
    db_file = home / "agentpost.db"
    with write_lock(db_file):
        started = time.monotonic()
        done = subprocess.run(
            [AGENTPOST, "send", "hello"], env=_env(home), capture_output=True, text=True, timeout=60
        )
        took = time.monotonic() - started
        assert done.returncode == 75, (done.returncode, done.stderr)
        assert_one_line(done.stderr, str(db_file), "locked by another process", "try again")
        assert took < 20
        # Reading needs no write lock: status still works while the lock is held.
        status = subprocess.run(
            [AGENTPOST, "queue", "status", "--json"],
            env=_env(home),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
    assert message_ids(db_file) == []
    done = subprocess.run(
        [AGENTPOST, "send", "hello"], env=_env(home), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert message_ids(db_file) == [done.stdout.strip()]


# -- a full disk -------------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for this test (needs root; skipped elsewhere)."""
    with mounted_tmpfs(tmp_path / "disk", "4m") as mount:
        yield mount


def fill(disk: Path) -> Path:
    """Write a file until the disk refuses with ENOSPC; return it (deleting it frees the space)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def test_disk_full_is_503_and_one_cli_line_then_resumes(small_disk: Path) -> None:
    home = make_home(small_disk)
    db_file = home / "agentpost.db"
    rt = runtime_for(home)
    try:
        with LiveServer(rt) as live, live.client() as c:
            accepted = [
                c.post("/api/message", json={"message": f"m{i}"}).json()["messageId"] for i in range(3)
            ]
            filler = fill(small_disk)
            body = {"message": "x" * 50_000, "messageId": "web_full0001"}
            for _ in range(2):  # and again: the failed write left the connection usable
                started = time.monotonic()
                assert assert_temporary_refusal(c.post("/api/message", json=body)) >= 10
                assert time.monotonic() - started < 5
            done = subprocess.run(
                [AGENTPOST, "send", "y" * 50_000], env=_env(home), capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 75, (done.returncode, done.stderr)
            assert_one_line(done.stderr, str(db_file), "disk", "full")

            filler.unlink()
            again = c.post("/api/message", json=body)
            assert again.status_code == 201, again.text
            assert message_ids(db_file) == [*accepted, "web_full0001"]
        with contextlib.closing(sqlite3.connect(db_file)) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        rt.close()


# -- a read-only file --------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_read_only_database_gives_one_line_from_cli_and_web_then_resumes(
    read_only_view: tuple[Path, Path],
) -> None:
    writable, view = read_only_view
    rt = runtime_for(make_home(writable))
    before = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "stored before").message_id
    rt.close()
    home = view / "home"
    db_file = home / "agentpost.db"

    done = subprocess.run(
        [AGENTPOST, "send", "hello"], env=_env(home), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 75, (done.returncode, done.stderr)
    assert_one_line(done.stderr, str(db_file), "read-only", "writable")

    # The web process cannot take requests it could not store: it says why in one line and exits 75, so
    # systemd or supervisor retries it later (before: a traceback).
    web = subprocess.run(
        [AGENTPOST, "run", "web"],
        env=_env(home, AGENTPOST_API_PORT=str(free_port())),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert web.returncode == 75, (web.returncode, web.stderr)
    assert_one_line(web.stderr, str(db_file), "read-only")

    subprocess.run(["mount", "-o", "remount,bind,rw", str(view)], check=True)
    done = subprocess.run(
        [AGENTPOST, "send", "hello"], env=_env(home), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert message_ids(db_file) == [before, done.stdout.strip()]


# -- PostgreSQL out of reach ------------------------------------------------------------------------------
class Relay:
    """A TCP relay to the PostgreSQL server on a port of its own; ``close`` makes that port refuse
    connections and cuts every open one, as a server that went down would."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def open(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@pytest.mark.postgres
def test_postgres_out_of_reach_is_503_and_the_same_process_resumes(tmp_path: Path, pg_url: str) -> None:
    name = pg_url.rpartition("/")[2]
    relay = Relay(("127.0.0.1", 5432))
    relay.open()
    url = f"postgresql://postgres@127.0.0.1:{relay.port}/{name}"
    rt = runtime_for(make_home(tmp_path, db_url=url))
    limits = StreamLimits(heartbeat=0.5, storage_retry=0.2)
    try:
        with LiveServer(rt, app_kwargs={"limits": limits}) as live, live.client() as c:
            first = c.post("/api/message", json={"message": "before"}).json()["messageId"]
            stream = SseReader(live.port, "/api/events/stream?after=0")
            try:
                assert next(stream.events(timeout=5))["id"]
                relay.close()
                for path in ("/api/message", "/api/queue/status", "/healthz"):
                    started = time.monotonic()
                    r = c.post(path, json={"message": "x"}) if path == "/api/message" else c.get(path)
                    assert_temporary_refusal(r)
                    assert time.monotonic() - started < 5
                relay.open()
                again = c.post("/api/message", json={"message": "after", "messageId": "web_back0001"})
                assert again.status_code == 201, again.text
                # The live stream paused through the outage and carries on from where it was.
                seen = wait_until(
                    lambda: [e for e in stream.events(timeout=0.5) if "web_back0001" in e.get("data", "")],
                    20,
                    "the stream to deliver an event appended after the outage",
                )
                assert seen and not stream.closed
            finally:
                stream.close()
        with psycopg.connect(pg_url) as conn:
            ids = [r[0] for r in conn.execute("SELECT message_id FROM messages ORDER BY id")]
        assert ids == [first, "web_back0001"]
    finally:
        rt.close()
        relay.close()


# -- the one classification ---------------------------------------------------------------------------------
def test_real_driver_errors_are_classified_and_bugs_are_not(tmp_path: Path) -> None:
    db_file = tmp_path / "x.db"
    sqlite3.connect(db_file).execute("CREATE TABLE t (x)").connection.commit()
    url = f"sqlite:///{db_file}"

    ro = sqlite3.connect(f"file:{db_file}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as readonly:
        ro.execute("INSERT INTO t VALUES (1)")
    problem = storage_problem(readonly.value, url)
    assert problem is not None and problem.kind == "read_only" and str(db_file) in problem.describe()

    with write_lock(db_file):
        other = sqlite3.connect(db_file, timeout=0)
        with pytest.raises(sqlite3.OperationalError) as locked:
            other.execute("BEGIN IMMEDIATE")
    problem = storage_problem(locked.value, url)
    assert problem is not None and problem.kind == "locked" and problem.retry_after <= 5

    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{free_port()}/x", connect_timeout=5)
    problem = storage_problem(refused.value, "postgresql://postgres:secret@127.0.0.1:1/x")
    assert problem is not None and problem.kind == "unreachable" and "secret" not in problem.describe()

    with pytest.raises(sqlite3.OperationalError) as bug:
        ro.execute("SELEC nonsense")
    assert storage_problem(bug.value, url) is None  # a programming error is never "try again later"
    assert storage_problem(ValueError("no"), url) is None
    assert storage_problem(OSError(errno.ENOSPC, "No space left on device"), url) is not None


def test_websocket_ack_under_a_held_lock_is_an_error_frame_and_the_socket_stays(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    rt = runtime_for(home)
    rt.events.append("t", "tick", {"n": 1})
    try:
        with (
            LiveServer(rt) as live,
            connect(
                f"ws://127.0.0.1:{live.port}/api/events/ws", additional_headers=auth_headers(live.port)
            ) as ws,
        ):
            ack = json.dumps({"type": "queue_ack", "topic": "t", "cursor": "1", "consumer": "dash"})
            with write_lock(home / "agentpost.db"):
                started = time.monotonic()
                ws.send(ack)
                answer = json.loads(ws.recv(timeout=10))
                assert answer["type"] == "error" and "try again" in answer["error"], answer
                assert answer["retryAfter"] >= 1 and time.monotonic() - started < 8
            ws.send(ack)
            assert json.loads(ws.recv(timeout=10)) == {"type": "queue_acked", "topic": "t", "cursor": "1"}
        assert rt.events.consumer_cursor("dash", "t") == "1"
    finally:
        rt.close()
