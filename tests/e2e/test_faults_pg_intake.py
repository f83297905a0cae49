"""Fault injection on intake: the real ``agentpost run telegram`` on PostgreSQL loses its database for a few
seconds while users write; every update must be taken in exactly once afterwards, and none confirmed to
Telegram (the offset moved past it) before it is stored.

The adapter reaches a database of its own (created for the test) through a TCP relay, :class:`PgOutage`.
Taking the database away does what a server restart does to a client, without restarting the server that
other tests share: the server ends the adapter's sessions (``pg_terminate_backend``: FATAL 57P01, "terminating
connection due to administrator command", then the socket closes) and new connections are refused
(ECONNREFUSED) until it is back. The test itself reads the database directly, so it can check during the
outage that nothing of the updates was stored half-way.
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from shared.storage.db import Database
from shared.storage.schema import open_database
from tests.channel_support import (
    HoldingTelegram,
    Proc,
    channel_home,
    discord_env,
    telegram_env,
    webhook_up,
    whatsapp_env,
)
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.whatsapp_api import FakeWhatsApp, signed_webhook, text_message_payload
from tests.fault_support import ADMIN_PG_URL, fresh_pg_database
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)
from tests.probes import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.timeout(120)]

CHAT = 42
ALICE, DM = 5001, 7001
CHANNELS = {"telegram": {"allowlist": [str(CHAT)], "poll_timeout_seconds": 1, "typing": False}}
#: Messages written while the database is away (and one command, answered by the adapter itself).
DURING = [f"written during the outage {i}" for i in range(1, 6)]


class PgOutage:
    """A TCP relay from a local port to the PostgreSQL server that can take the database away (see the
    module docstring) and bring it back."""

    def __init__(self, database: str, target: tuple[str, int] = ("127.0.0.1", 5432)) -> None:
        self.database = database
        self.target = target
        self._lock = threading.Lock()
        self._upstreams: list[socket.socket] = []
        self._away = False
        #: Connections refused while away (each one a try of the adapter to reach its database).
        self.refused = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self) -> str:
        """The database's URL through the relay."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def down(self) -> int:
        """End the sessions open through the relay and refuse new ones, as a restarting server does;
        returns how many sessions were ended."""
        with self._lock:
            self._away = True
            ports = [s.getsockname()[1] for s in self._upstreams if s.fileno() != -1]
        if not ports:
            return 0
        with psycopg.connect(ADMIN_PG_URL, autocommit=True) as admin:
            # The call is in the select list, so it runs only for the rows the WHERE clause keeps (in a
            # WHERE clause the planner may run it first, on every session of the server).
            rows = admin.execute(
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND client_port = ANY(%s)",
                (self.database, ports),
            ).fetchall()
            pids = [pid for (pid, ended) in rows if ended]

            def gone() -> bool:  # the signal is asynchronous: down means the sessions have ended
                found = admin.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,))
                row = found.fetchone()
                return row is not None and row[0] == 0

            wait_for(gone, 10, "the ended sessions to go")
        return len(pids)

    def up(self) -> None:
        """Let connections through again."""
        with self._lock:
            self._away = False

    def refusals(self) -> int:
        with self._lock:
            return self.refused

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for upstream in self._upstreams:
                with contextlib.suppress(OSError):
                    upstream.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed at the end of the test
            with self._lock:
                away = self._away
            if away:
                threading.Thread(target=self._refuse, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                # Taken away while this session was being opened: down() did not see it, so it goes here
                # (otherwise it would outlive the outage).
                away = self._away
                if not away:
                    self._upstreams = [s for s in self._upstreams if s.fileno() != -1] + [upstream]
            if away:
                upstream.close()
                threading.Thread(target=self._refuse, args=(client,), daemon=True).start()
                continue
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _refuse(self, client: socket.socket) -> None:
        """Answer a new session as a server that is starting up does (FATAL 57P03), then hang up."""
        with client:
            client.settimeout(5)
            try:
                while True:
                    length, code = struct.unpack("!ii", _recv_exact(client, 8))
                    if length == 8 and code in (_SSL_REQUEST, _GSSENC_REQUEST):
                        client.sendall(b"N")  # no encryption: the client goes on with its startup packet
                        continue
                    _recv_exact(client, length - 8)
                    break
                fields = b"SFATAL\0VFATAL\0C57P03\0Mthe database system is starting up\0\0"
                client.sendall(b"E" + struct.pack("!i", len(fields) + 4) + fields)
            except OSError:
                return
        with self._lock:
            self.refused += 1

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):  # one side ended: end the other too, as a dropped server would
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


_SSL_REQUEST, _GSSENC_REQUEST = 80877103, 80877104


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the client hung up")
        data += chunk
    return data


def _messages(db: Database) -> list[str]:
    return [str(r["message"]) for r in db.read("SELECT message FROM messages ORDER BY id")]


def _cursors(db: Database) -> int:
    return int(db.read_scalar("SELECT COUNT(*) FROM kv WHERE scope = 'cursor:discord'") or 0)


def _met_outage(adapter: Proc) -> int:
    """How many Discord messages the adapter has tried to take in while its database was away, as its log
    tells: discord.py's report of a handler that failed, or the adapter saying it waits for the database."""
    out = adapter.output()
    waits = re.findall(r"taking in message \d+: .* waiting for the database", out)
    return out.count("Ignoring exception in on_message") + len(waits)


@pytest.fixture(name="pg")
def pg_behind_relay() -> Iterator[tuple[str, PgOutage]]:
    """The fixture ``pg``: a fresh database (its direct URL) and the relay the adapter reaches it through."""
    with fresh_pg_database() as direct_url:
        outage = PgOutage(direct_url.rpartition("/")[2])
        try:
            yield direct_url, outage
        finally:
            outage.close()


def test_telegram_updates_written_while_postgres_is_away_are_each_queued_once(
    tmp_path: Path, fake: HoldingTelegram, pg: tuple[str, PgOutage]
) -> None:
    direct_url, outage = pg
    home = channel_home(tmp_path, outage.url(), CHANNELS)
    db = open_database(direct_url)
    adapter = Proc("telegram", home, telegram_env(fake), tmp_path / "telegram.log")
    try:
        first = fake.push_text(CHAT, "written before the outage")
        wait_for(lambda: _messages(db) == ["written before the outage"], 30, "the first message queued")
        fake.wait_for_offset(first["update_id"] + 1, timeout=10)

        assert outage.down() >= 1  # the adapter had sessions open, and lost them
        # A group message not meant for the bot: nothing to queue, only the offset to move past it.
        chatter = fake.push_text(-100, "talking among ourselves", user_id=CHAT, chat_type="group")
        updates = [fake.push_text(CHAT, text) for text in DURING]
        command = fake.push_text(CHAT, "/help")
        # The adapter keeps being handed the updates and cannot store them: none may be confirmed.
        refused = outage.refusals()
        wait_for(
            lambda: outage.refusals() >= refused + 3 or adapter.popen.poll() is not None,
            30,
            "the adapter trying its database",
        )
        assert adapter.popen.poll() is None, f"the adapter died:\n{adapter.output()[-3000:]}"
        assert _messages(db) == ["written before the outage"]
        assert fake.confirmed_offset <= chatter["update_id"], "an update was confirmed, not stored"

        outage.up()
        wait_for(lambda: len(_messages(db)) == 1 + len(DURING), 30, "the messages written meanwhile")
        fake.wait_for_offset(command["update_id"] + 1, timeout=30)
        assert updates[-1]["update_id"] < command["update_id"]
        wait_for(lambda: fake.texts(CHAT), 30, "the answer to /help")
        answers = [t for t in fake.texts(CHAT) if t.startswith("Commands:")]
        final = _messages(db)
        alive = adapter.popen.poll() is None
    finally:
        adapter.stop()
        db.close()
    assert final == ["written before the outage", *DURING]  # each once, in the order written
    assert alive, "the adapter died while its database was away"
    assert len(answers) == 1


def test_discord_messages_written_while_postgres_is_away_are_each_queued_once(
    tmp_path: Path, pg: tuple[str, PgOutage]
) -> None:
    direct_url, outage = pg
    channels = {"discord": {"allowlist": [str(ALICE)], "guild_ready_timeout_seconds": 0.1, "typing": False}}
    home = channel_home(tmp_path, outage.url(), channels)
    db = open_database(direct_url)
    with FakeDiscord(heartbeat_interval_ms=5_000) as fake:
        adapter = Proc("discord", home, discord_env(fake), tmp_path / "discord.log")
        try:
            wait_for(lambda: fake.identifies > 0, 20, "the adapter to identify")
            fake.push_message(DM, "written before the outage", ALICE, "alice")
            wait_for(lambda: _messages(db) == ["written before the outage"], 30, "the first message queued")
            wait_for(lambda: _cursors(db) == 1, 10, "the chat's catch-up cursor recorded")

            assert outage.down() >= 1
            for text in DURING:
                fake.push_message(DM, text, ALICE, "alice")
            # The chat's messages are taken in one at a time, in order: the first meets the outage, the
            # others wait for their turn behind it.
            wait_for(lambda: _met_outage(adapter) >= 1, 30, "the chat's first message meeting the outage")
            assert _messages(db) == ["written before the outage"]
            outage.up()
            wait_for(lambda: len(_messages(db)) == 1 + len(DURING), 30, "the messages written meanwhile")
            final = _messages(db)
            alive = adapter.popen.poll() is None
        finally:
            adapter.stop()
            db.close()
    assert final == ["written before the outage", *DURING]  # each once, in the order written
    assert alive, "the adapter died while its database was away"


WA_SECRET = "app-secret-for-tests"
WA_ALICE = "15550001111"


def test_whatsapp_webhook_waits_for_postgres_then_answers_and_never_acks_what_it_did_not_store(
    tmp_path: Path, pg: tuple[str, PgOutage]
) -> None:
    direct_url, outage = pg
    channels = {"whatsapp": {"allowlist": [WA_ALICE], "typing": False, "read_receipts": False}}
    home = channel_home(tmp_path, outage.url(), channels)
    db = open_database(direct_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}/webhook"

    def post(text: str, wamid: str) -> int:
        body, headers = signed_webhook(WA_SECRET, text_message_payload(WA_ALICE, text, wamid=wamid))
        return httpx.post(url, content=body, headers=headers, timeout=30).status_code

    with FakeWhatsApp() as fake:
        adapter = Proc("whatsapp", home, whatsapp_env(fake, WA_SECRET, port), tmp_path / "whatsapp.log")
        try:
            wait_for(lambda: webhook_up(url), 20, "the webhook")
            assert post("written before the outage", "wamid.B0") == 200

            # A short outage: the webhook holds the request, and answers 200 once the message is stored.
            outage.down()
            answers: list[int] = []
            waiting = threading.Thread(target=lambda: answers.append(post("written meanwhile", "wamid.M1")))
            waiting.start()
            wait_for(
                lambda: "taking in message wamid.M1" in adapter.output() or answers,
                20,
                "the webhook meeting the outage",
            )
            assert not answers and _messages(db) == ["written before the outage"]
            outage.up()
            waiting.join(30)
            assert answers == [200]

            # A long one: after its short wait the webhook answers 503 (not 200), so Meta delivers again.
            outage.down()
            assert post("written during a long outage", "wamid.M2") == 503
            assert _messages(db) == ["written before the outage", "written meanwhile"]
            outage.up()
            assert post("written during a long outage", "wamid.M2") == 200  # Meta's redelivery
            assert post("written during a long outage", "wamid.M2") == 200  # and another: a duplicate
            final = _messages(db)
        finally:
            adapter.stop()
            db.close()
    assert final == ["written before the outage", "written meanwhile", "written during a long outage"]
