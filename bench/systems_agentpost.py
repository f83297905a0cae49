"""agentpost's own queue as a benchmark system (harness.QueueSystem), on SQLite and on PostgreSQL.

Only the public queue operations are used, exactly as the processor uses them:

* producer: one :meth:`Queue.intake.enqueue_message` per message (agent from the message, one conversation per
  agent), each its own transaction with its ``message_received`` event.
* consumer: :meth:`Queue.messages.agents_with_pending`, then per agent :meth:`Queue.messages.claim_all_pending_messages`
  (the agent lease plus every available message of that agent), yield each id, then one
  :meth:`Queue.messages.complete_messages` for the group (which enqueues the response with its events in the same
  transaction; with ``release_when_idle`` it also gives up the agent when nothing else waits, else
  :meth:`Queue.leases.release_agent` follows). When nothing is claimable: at most every half second (as the processor recovers on
  its timer) :meth:`recover_stale_messages`
  (returns the messages of a SIGKILLed consumer once its 2 s lease lapses) and yield None.

A (re)started consumer takes a new worker id, as a restarted processor does. On PostgreSQL the sessions
run with ``synchronous_commit=off`` like the hand-written SKIP LOCKED peer (see systems_peers.py), so both
have the durability of SQLite in WAL with ``synchronous=NORMAL``.

``AgentpostSqliteRetained`` / ``AgentpostPostgresRetained`` start from a database that already holds
``retained`` completed messages (for bench/growth.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from harness import Msg, msg_id_of

from shared.chat.address import ChatAddress
from shared.storage import schema

#: Agents the directory knows: the harness default of 8 (agent-0 .. agent-7; run_peers --agents N > 8 needs
#: more). How enqueue fares with a large directory is bench/enqueue_agents.py's question, not this one's.
AGENT_NAMES: tuple[str, ...] = tuple(f"agent-{i}" for i in range(8))
CHANNEL = "bench"
REPLY = "done: a short reply from the benchmark agent"
PG_SYNC_OFF = "options=-c%20synchronous_commit%3Doff"


class AgentpostSqlite:
    """agentpost on SQLite (the default deployment): target is a fresh database file."""

    name: str = "agentpost-sqlite"
    backend: Literal["sqlite", "postgres"] = "sqlite"
    max_n: int | None = None
    lease_ms: int = 2_000
    #: How often an idle consumer takes back a dead consumer's claims (a quarter of the lease: a SIGKILLed
    #: consumer's messages are back within 2.5 s).
    recover_every_s: float = 0.5
    retained: int = 0  # completed messages already in the database before the run

    # -- helpers (run in whichever process calls them) ---------------------------------------------------
    def url(self, target: str) -> str:
        if self.backend == "sqlite":
            return f"sqlite:///{target}"
        return target + ("&" if "?" in target else "?") + PG_SYNC_OFF

    def open_queue(self, target: str, *, create: bool = False) -> Any:
        """A Queue over the target (imports here: the harness parent need not import agentpost)."""
        from shared.queue.core import Directory, Queue
        from shared.settings.model import QueueSettings
        from shared.storage.schema import open_database

        db = open_database(self.url(target), create=create)
        return Queue(db, QueueSettings(lease_seconds=self.lease_ms / 1000), Directory.single(*AGENT_NAMES))

    # -- QueueSystem -------------------------------------------------------------------------------------
    def setup(self, target: str) -> None:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        if self.retained:
            _copy_retained_template(self, target)
            return
        self.open_queue(target, create=True).db.close()

    def producer(self, target: str, messages: Sequence[Msg]) -> Iterator[int]:
        queue = self.open_queue(target)
        queue.db.connection()  # connect before the start signal

        def run() -> Iterator[int]:
            try:
                for m in messages:
                    queue.intake.enqueue_message(
                        ChatAddress(CHANNEL, "bench-user", conversation=m.agent), m.body, agent=m.agent
                    )
                    yield m.id
            finally:
                queue.db.close()

        return run()

    def consumer(self, target: str, slot: int) -> Iterator[int | None]:
        from shared.queue.core import LeaseLost

        queue = self.open_queue(target)
        queue.db.connection()
        worker = f"bench-{slot}-{os.getpid()}-{secrets.token_hex(3)}"

        def run() -> Iterator[int | None]:
            recover_at = 0.0
            try:
                while True:
                    got = False
                    for agent in queue.messages.agents_with_pending():
                        group = queue.messages.claim_all_pending_messages(agent, worker)
                        if not group:
                            continue  # another consumer holds the agent
                        got = True
                        for m in group:
                            yield msg_id_of(m.message)
                        # LeaseLost: our lease lapsed and another worker took over; it completes them.
                        # The release rides with the completion when nothing else waits, as in the processor.
                        released = False
                        with contextlib.suppress(LeaseLost):
                            released = queue.messages.complete_messages(
                                [m.message_id for m in group], worker, REPLY, release_when_idle=True
                            ).released
                        if not released:
                            queue.leases.release_agent(agent, worker)
                    if not got:
                        # As the processor does on its timer (every recover_interval_seconds), not on every
                        # empty look: recovery reads every claim and lease, a dozen times the cost of a look.
                        if time.monotonic() >= recover_at:
                            queue.failures.recover_stale_messages()
                            recover_at = time.monotonic() + self.recover_every_s
                        yield None
            finally:
                queue.db.close()

        return run()


class AgentpostPostgres(AgentpostSqlite):
    """agentpost on PostgreSQL: every table dropped and created afresh in the benchmark database per run."""

    name = "agentpost-pg"
    backend = "postgres"

    def setup(self, target: str) -> None:
        from shared.storage.models import metadata

        queue = self.open_queue(target, create=False)
        try:
            metadata().drop_all(queue.db.engine)
            schema.create_schema(queue.db)
            if self.retained:
                fill_retained(queue.db, self.retained)
        finally:
            queue.db.close()


class AgentpostSqliteRetained(AgentpostSqlite):
    """agentpost on SQLite with 1,000,000 completed messages retained (growth benchmark)."""

    name = "agentpost-sqlite-1m"
    retained = 1_000_000


class AgentpostPostgresRetained(AgentpostPostgres):
    """agentpost on PostgreSQL with 1,000,000 completed messages retained (growth benchmark)."""

    name = "agentpost-pg-1m"
    retained = 1_000_000


# ------------------------------------------------------------------------------------ retained history

_templates: dict[tuple[str, int], Path] = {}


def _copy_retained_template(system: AgentpostSqlite, target: str) -> None:
    """Fill a template database once per process and copy it for every run (a copy takes a second,
    a fill of a million rows ten)."""
    key = (system.name, system.retained)
    template = _templates.get(key)
    if template is None or not template.exists():
        folder = Path(tempfile.mkdtemp(prefix="agentpost-bench-template-"))
        template = folder / "retained.db"
        queue = system.open_queue(str(template), create=True)
        try:
            fill_retained(queue.db, system.retained)
            queue.db.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            queue.db.close()
        _templates[key] = template
    shutil.copyfile(template, target)


def cleanup_templates() -> None:
    """Remove the template databases made by this process."""
    for template in _templates.values():
        shutil.rmtree(template.parent, ignore_errors=True)
    _templates.clear()


_FILL_COLUMNS = (
    "message_id, channel, sender, sender_id, message, agent, from_agent, status, retry_count, created_at, "
    "updated_at, conversation, metadata, available_at, hops, external_id"
)


def fill_retained(db: Any, count: int, *, agents: int = 8, batch: int = 200_000) -> None:
    """Insert ``count`` completed messages (~120-byte bodies, 8 agents, old timestamps) with bulk
    INSERT ... SELECT over a generated series, ``batch`` rows per transaction."""
    body = (
        "'history|' || printf('%0110d', n)"
        if db.dialect.is_sqlite
        else "'history|' || lpad(n::text, 110, '0')"
    )
    series = (
        "WITH RECURSIVE s(n) AS (SELECT :lo UNION ALL SELECT n + 1 FROM s WHERE n + 1 < :hi) SELECT n FROM s"
        if db.dialect.is_sqlite
        else "SELECT n FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint) - 1) AS g(n)"
    )
    agent = f"'agent-' || (n % {agents})"
    sql = (
        f"INSERT INTO messages ({_FILL_COLUMNS}) SELECT 'old_' || n, '{CHANNEL}', 'bench-user', '', {body}, "
        f"{agent}, NULL, 'completed', 0, 1000 + n, 1000 + n, {agent}, '{{}}', 1000 + n, 0, NULL FROM ({series}) AS t"
    )
    for lo in range(0, count, batch):
        with db.transaction() as tx:
            tx.execute(sql, {"lo": lo, "hi": min(count, lo + batch)})
    if not db.dialect.is_sqlite:
        with db.transaction() as tx:
            tx.execute("ANALYZE messages")


ALL_AGENTPOST: tuple[type[AgentpostSqlite], ...] = (AgentpostSqlite, AgentpostPostgres)


class AgentpostPostgresNiced(AgentpostPostgres):
    """agentpost on PostgreSQL with each consumer process at ``nice 10``: the producer (and the server) get
    the CPU first. A diagnosis for machines with fewer cores than busy processes, not a benchmark row: it
    shows what the consumers would drain if they did not take the producer's CPU (docs/benchmarks.md)."""

    name = "agentpost-pg-niced"

    def consumer(self, target: str, slot: int) -> Iterator[int | None]:
        os.nice(10)
        return super().consumer(target, slot)
