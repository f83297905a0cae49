"""Instructions per message, counted by callgrind: agentpost vs the plain sqlite3 baselines, SQLite.

Wall-clock rates on this kind of machine drift by up to 2x between minutes (run_peers' own peers move as
much as agentpost between two runs), which hides changes of 5-15%. Counting the instructions a workload
executes does not drift: valgrind's callgrind gives the same count for the same code and input whatever
else the machine does. Each workload runs in its own ``valgrind --tool=callgrind --instr-atstart=no``
process, which switches counting on (``callgrind_control -i on``) only around the measured part, so the
interpreter's start-up, the imports and the untimed fills are not counted. Counts include the C code of
SQLite and Python; the kernel's work (write, fsync, locks) is not counted, so use this beside the rates,
not instead of them.

Workloads (the same code paths as the throughput benchmarks):

* ``enqueue``: ``Queue.intake.enqueue_message`` (agent named, one conversation per agent) vs the
  ``sqlite-insert-event`` peer's producer (INSERT of the message + INSERT of its event, one transaction).
* ``enqueue-sql``: agentpost's enqueue statements alone (the message INSERT and its event INSERT as the
  queue runs them, in BEGIN IMMEDIATE ... COMMIT, from a bare loop): the floor our schema sets, whatever
  the Python around it costs.
* ``drain``: 20 messages waiting per agent, drained as bench/claim_batch.py drains them (agentpost: claim
  all of an agent, complete with a reply; plain: claim all of an agent, one UPDATE per message).
* ``drain-sql``: agentpost's two status changes alone (the claim UPDATE as the queue runs it, then the
  completion UPDATE of the group, each in BEGIN IMMEDIATE ... COMMIT, from a bare loop; no lease, event or
  reply): the floor the messages table sets for a drain.
* ``drain-sql-hot-split``: the same two status changes on an experimental schema that keeps the state that
  changes (status, holder, lease, times) in a narrow table of its own beside the message content, the claim
  then reading the content by id. It answers "would a narrow hot-state table make the drain cheaper?".

    bench/.venv/bin/python bench/instructions.py --json out.json      # ~2 minutes

Needs valgrind (``apt-get install valgrind``); without it, prints why and exits 0 with no results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shared.chat.address import ChatAddress

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from measure import say, write_json  # noqa: E402

#: workload -> (agentpost's, the baseline's); None: no baseline of its own (see the module docstring).
PAIRS: dict[str, tuple[str, str | None]] = {
    "enqueue": ("enqueue-agentpost", "enqueue-plain"),
    "enqueue-sql": ("enqueue-sql-agentpost", "enqueue-plain"),
    "drain": ("drain-agentpost", "drain-plain"),
    "drain-sql": ("drain-sql-agentpost", "drain-plain"),
    "drain-sql-hot-split": ("drain-sql-hot-split", "drain-plain"),
}


# ---------------------------------------------------------------------------------- inside valgrind


def _counting(on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
        stdout=subprocess.DEVNULL,
        check=True,
    )


def _enqueue_agentpost(folder: Path, n: int, warm: int) -> int:
    from harness import make_messages
    from systems_agentpost import CHANNEL, AgentpostSqlite

    system = AgentpostSqlite()
    target = str(folder / "queue.db")
    system.setup(target)
    queue = system.open_queue(target)
    messages = make_messages(warm + n, 8, 120)
    for m in messages[:warm]:
        queue.intake.enqueue_message(
            ChatAddress(CHANNEL, "bench-user", conversation=m.agent), m.body, agent=m.agent
        )
    _counting(True)
    for m in messages[warm:]:
        queue.intake.enqueue_message(
            ChatAddress(CHANNEL, "bench-user", conversation=m.agent), m.body, agent=m.agent
        )
    _counting(False)
    queue.db.close()
    return n


def _enqueue_plain(folder: Path, n: int, warm: int) -> int:
    from harness import make_messages
    from systems_peers import SqliteInsertEvent

    peer = SqliteInsertEvent()
    target = str(folder / "queue.db")
    peer.setup(target)
    messages = make_messages(warm + n, 8, 120)
    produce = peer.producer(target, messages)
    for _ in range(warm):
        next(produce)
    _counting(True)
    for _ in range(n):
        next(produce)
    _counting(False)
    produce.close()
    return n


def _enqueue_sql_agentpost(folder: Path, n: int, warm: int) -> int:
    """agentpost's two enqueue statements, parameters prepared beforehand, from a bare loop."""
    import sqlite3

    from harness import make_messages
    from systems_agentpost import CHANNEL, AgentpostSqlite

    from shared.events.log import encode_payload
    from shared.ids import new_id
    from shared.storage.dialect import SQLITE
    from shared.storage.queries.enqueue import INSERT_MESSAGE

    target = str(folder / "queue.db")
    AgentpostSqlite().setup(target)
    conn = sqlite3.connect(target, isolation_level=None)
    from shared.storage.db import configure_sqlite

    configure_sqlite(conn, 5_000)
    event_sql = SQLITE.sql(SQLITE.event_insert)
    rows = []
    for m in make_messages(warm + n, 8, 120):
        now = int(time.time() * 1000)
        mid = new_id(CHANNEL)
        message = {
            "message_id": mid,
            "channel": CHANNEL,
            "sender": "bench-user",
            "sender_id": "",
            "message": m.body,
            "agent": m.agent,
            "from_agent": None,
            "conversation": m.agent,
            "metadata": "{}",
            "available_at": now,
            "hops": 0,
            "external_id": None,
            "now": now,
        }
        payload = {"channel": CHANNEL, "sender": "bench-user", "agent": m.agent, "named": True}
        event = {
            "topic": "queue",
            "type": "message_received",
            "message_id": mid,
            "payload": encode_payload(payload),
            "created_at": now,
        }
        rows.append((message, event))

    def one(message: dict[str, Any], event: dict[str, Any]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(INSERT_MESSAGE, message)
        conn.execute(event_sql, event)
        conn.execute("COMMIT")

    for message, event in rows[:warm]:
        one(message, event)
    _counting(True)
    for message, event in rows[warm:]:
        one(message, event)
    _counting(False)
    conn.close()
    return n


def _drain(system: str) -> Callable[[Path, int, int], int]:
    def run(folder: Path, n: int, warm: int) -> int:
        from claim_batch import SYSTEMS
        from harness import make_messages

        size = 8 * 20
        rounds, warm_rounds = max(1, n // size), max(1, warm // size)
        fill, drain, close = SYSTEMS[system](str(folder / "queue.db"))
        messages = make_messages((warm_rounds + rounds) * size, 8, 120)
        drained = 0
        for r in range(warm_rounds + rounds):
            batch = messages[r * size : (r + 1) * size]
            fill(batch)
            counted = r >= warm_rounds
            if counted:
                _counting(True)
            got = drain()
            if counted:
                _counting(False)
                drained += len(got)
            if sorted(got) != [m.id for m in batch]:
                raise RuntimeError(f"{system} round {r}: drained {len(got)} of the {size} messages")
        close()
        return drained

    return run


#: The split schema of ``drain-sql-hot-split``: content (written once) and state (rewritten by every status
#: change) in two tables joined by id, with the state table carrying the partial indexes the queue reads.
_HOT_SPLIT_SCHEMA = (
    "CREATE TABLE content (id INTEGER PRIMARY KEY, message_id TEXT NOT NULL UNIQUE, channel TEXT NOT NULL,"
    " sender TEXT NOT NULL, sender_id TEXT NOT NULL, message TEXT NOT NULL, from_agent TEXT,"
    " retry_count INTEGER NOT NULL DEFAULT 0, manual_retries INTEGER NOT NULL DEFAULT 0, last_error TEXT,"
    " created_at INTEGER NOT NULL, conversation TEXT NOT NULL, metadata TEXT NOT NULL,"
    " hops INTEGER NOT NULL DEFAULT 0, external_id TEXT, interruptions INTEGER NOT NULL DEFAULT 0)",
    "CREATE UNIQUE INDEX ux_content_external ON content (channel, external_id) WHERE external_id IS NOT NULL",
    "CREATE TABLE state (id INTEGER PRIMARY KEY, agent TEXT NOT NULL, status TEXT NOT NULL,"
    " available_at INTEGER NOT NULL, claimed_by TEXT, lease_until INTEGER, updated_at INTEGER NOT NULL,"
    " run_started_at INTEGER, channel TEXT NOT NULL, conversation TEXT NOT NULL)",
    "CREATE INDEX ix_state_pending ON state (agent, available_at, id) WHERE status = 'pending'",
    "CREATE INDEX ix_state_processing ON state (lease_until) WHERE status = 'processing'",
    "CREATE INDEX ix_state_open ON state (channel, conversation) WHERE status IN ('pending', 'processing')",
    "CREATE INDEX ix_state_completed ON state (updated_at) WHERE status = 'completed'",
    "CREATE INDEX ix_state_dead ON state (updated_at) WHERE status = 'dead'",
)
_HOT_SPLIT_CLAIM = (
    "UPDATE state SET status = 'processing', claimed_by = :worker, lease_until = :lease, updated_at = :now,"
    " run_started_at = NULL WHERE id IN (SELECT id FROM state WHERE status = 'pending' AND agent = :agent"
    " AND available_at <= :now ORDER BY id) RETURNING id, available_at"
)


def _drain_sql(split: bool) -> Callable[[Path, int, int], int]:
    """The drain's two status changes alone, on agentpost's messages table or on the split schema."""

    def run(folder: Path, n: int, warm: int) -> int:
        import sqlite3

        from systems_agentpost import CHANNEL, AgentpostSqlite

        from shared.queue.records import sql_in
        from shared.storage.db import configure_sqlite
        from shared.storage.queries.enqueue import INSERT_MESSAGE
        from shared.storage.queries.messages import CLAIM_RETURNS

        target = str(folder / "queue.db")
        if split:
            conn = sqlite3.connect(target, isolation_level=None)
            configure_sqlite(conn, 5_000)
            for statement in _HOT_SPLIT_SCHEMA:
                conn.execute(statement)
            content = CLAIM_RETURNS.replace("available_at, ", "")
        else:
            system = AgentpostSqlite()
            system.setup(target)
            queue = system.open_queue(target)
            # The statement itself, as the queue runs it (its dialect clauses filled in).
            claim_sql = queue.db.dialect.sql(queue.messages.claim_sql)
            queue.db.close()
            conn = sqlite3.connect(target, isolation_level=None)
            configure_sqlite(conn, 5_000)
        agents, per_agent = 8, 20
        rounds, warm_rounds = max(1, n // (agents * per_agent)), max(1, warm // (agents * per_agent))
        drained = 0
        for r in range(warm_rounds + rounds):
            now = int(time.time() * 1000)
            conn.execute("BEGIN IMMEDIATE")
            for a in range(agents):
                for k in range(per_agent):
                    row = {
                        "message_id": f"bench_{r}x{a}x{k}",
                        "channel": CHANNEL,
                        "sender": "bench-user",
                        "sender_id": "",
                        "message": "x" * 120,
                        "agent": f"agent-{a}",
                        "from_agent": None,
                        "conversation": f"agent-{a}",
                        "metadata": "{}",
                        "available_at": now,
                        "hops": 0,
                        "external_id": None,
                        "now": now,
                    }
                    if split:
                        new = conn.execute(
                            "INSERT INTO content (message_id, channel, sender, sender_id, message, from_agent,"
                            " created_at, conversation, metadata, hops, external_id) VALUES (:message_id,"
                            " :channel, :sender, :sender_id, :message, :from_agent, :now, :conversation,"
                            " :metadata, :hops, :external_id)",
                            row,
                        ).lastrowid
                        conn.execute(
                            "INSERT INTO state (id, agent, status, available_at, updated_at, channel,"
                            " conversation) VALUES (:id, :agent, 'pending', :now, :now, :channel, :conversation)",
                            {**row, "id": new},
                        )
                    else:
                        conn.execute(INSERT_MESSAGE, row)
            conn.execute("COMMIT")
            counted = r >= warm_rounds
            if counted:
                _counting(True)
            for a in range(agents):
                claim = {"worker": "w", "lease": now + 60_000, "now": now, "agent": f"agent-{a}"}
                conn.execute("BEGIN IMMEDIATE")
                if split:
                    ids = [row[0] for row in conn.execute(_HOT_SPLIT_CLAIM, claim).fetchall()]
                    clause, keys = sql_in("i", ids)
                    got = conn.execute(f"SELECT {content} FROM content WHERE id IN {clause}", keys).fetchall()
                    # Completed by message id, as complete_messages is called: the same lookups as below.
                    clause, keys = sql_in("m", [row[1] for row in got])
                    done = (
                        "UPDATE state SET status = 'completed', updated_at = :now, lease_until = NULL"
                        f" WHERE id IN (SELECT id FROM content WHERE message_id IN {clause})"
                        " AND status = 'processing' AND claimed_by = :worker RETURNING id"
                    )
                else:
                    got = conn.execute(claim_sql, claim).fetchall()
                    clause, keys = sql_in("m", [row[1] for row in got])
                    done = (  # as complete_messages' take_group runs it
                        "UPDATE messages SET status = 'completed', updated_at = :now, lease_until = NULL"
                        f" WHERE message_id IN {clause} AND status = 'processing' AND claimed_by = :worker"
                        " RETURNING id, message_id"
                    )
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
                finished = conn.execute(done, {**keys, "now": now, "worker": "w"}).fetchall()
                conn.execute("COMMIT")
                if len(got) != per_agent or len(finished) != per_agent:
                    raise RuntimeError(f"round {r} agent {a}: claimed {len(got)}, completed {len(finished)}")
            if counted:
                _counting(False)
                drained += agents * per_agent
        conn.close()
        return drained

    return run


WORKLOADS: dict[str, Callable[[Path, int, int], int]] = {
    "enqueue-agentpost": _enqueue_agentpost,
    "enqueue-plain": _enqueue_plain,
    "enqueue-sql-agentpost": _enqueue_sql_agentpost,
    "drain-agentpost": _drain("agentpost"),
    "drain-plain": _drain("plain"),
    "drain-sql-agentpost": _drain_sql(split=False),
    "drain-sql-hot-split": _drain_sql(split=True),
}


def _inside(workload: str, n: int, warm: int, result: Path) -> int:
    sys.path.insert(0, str(HERE.parent))  # the checkout this script belongs to
    try:
        from shared.storage.wal_checkpoint import CHECKPOINTER
    except ImportError:  # a checkout from before the background checkpointer
        pass
    else:
        # It checkpoints every 0.25 s of wall time, and valgrind runs the process ~50 times slower: counted,
        # it would add ~50 times its real share per message. Off, the counts are the callers' own work
        # (SQLite's automatic checkpoint stays), comparable across commits.
        CHECKPOINTER.background = False
    folder = Path(tempfile.mkdtemp(prefix=f"agentpost-instr-{workload}-"))
    try:
        counted = WORKLOADS[workload](folder, n, warm)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result.write_text(json.dumps({"messages": counted}))
    return 0


# ---------------------------------------------------------------------------------- outside valgrind


def count(workload: str, n: int, warm: int) -> dict[str, Any]:
    """Run one workload under callgrind; its instructions in all and per message."""
    with tempfile.TemporaryDirectory(prefix="agentpost-callgrind-") as tmp:
        out, result = Path(tmp) / "callgrind.out", Path(tmp) / "result.json"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--inside",
            workload,
            "--n",
            str(n),
            "--warm",
            str(warm),
            "--result",
            str(result),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode != 0 or found is None or not result.exists():
            raise RuntimeError(f"{workload} failed under callgrind:\n{done.stderr[-3000:]}")
        messages = int(json.loads(result.read_text())["messages"])
        total = int(found.group(1))
    return {
        "workload": workload,
        "messages": messages,
        "instructions": total,
        "per_message": total / messages,
    }


def measure(n: int, warm: int, only: list[str] | None = None) -> dict[str, Any]:
    counts: dict[str, dict[str, Any]] = {}
    for workload in only or list(WORKLOADS):
        t = time.perf_counter()
        counts[workload] = count(workload, n, warm)
        say(
            f"instructions {workload:<22} {counts[workload]['per_message']:>10,.0f} per message "
            f"({counts[workload]['messages']:,} messages, {time.perf_counter() - t:.0f} s)"
        )
    pairs = {}
    for name, (ours, theirs) in PAIRS.items():
        if ours not in counts or (theirs is not None and theirs not in counts):
            continue
        a = counts[ours]["per_message"]
        b = counts[theirs]["per_message"] if theirs else None
        pairs[name] = {"agentpost": a, "baseline": b, "ratio": (b / a) if b else None}
    return {"n": n, "warm": warm, "counts": counts, "pairs": pairs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_600, help="messages counted per workload (default 1,600)")
    p.add_argument("--warm", type=int, default=320, help="messages before counting starts (default 320)")
    p.add_argument("--json", default=None, help="write the results as JSON")
    p.add_argument(
        "--only",
        default=None,
        help=f"comma-separated workloads to count (default all: {', '.join(WORKLOADS)}); pairs need both sides",
    )
    p.add_argument("--inside", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.inside:
        return _inside(args.inside, args.n, args.warm, Path(args.result))
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        say("instructions: valgrind is not installed here (apt-get install valgrind); nothing measured")
        return 0
    only = args.only.split(",") if args.only else None
    unknown = [w for w in only or [] if w not in WORKLOADS]
    if unknown:
        p.error(f"unknown workload {', '.join(unknown)} (known: {', '.join(WORKLOADS)})")
    r = measure(args.n, args.warm, only)
    for name, pair in r["pairs"].items():
        say(
            f"instructions {name}: agentpost {pair['agentpost']:,.0f}, baseline {pair['baseline']:,.0f} per "
            f"message, ratio {pair['ratio']:.2f} (baseline / agentpost: 1.00 = as cheap)"
        )
    write_json(args.json, r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
