"""History: does what people do every day cost the same on a database that holds a long history?

Builds two databases per backend: a near-empty one (60 chats of 20 messages each: a full first page of the chat list, and chats as long as those of the history) and one with a long
history (by default 200,000 finished messages and replies over 10,000 chats, each with three events, two
agent turns and a cost record, and a chat-room post per ten messages), loaded in bulk
(bench/history_sql.py). The history is 8 to 90 days old, so the last week's activity (which ``usage``
and the queue's counts of the last day read by design) is the same in both databases: what is measured is
what old rows cost. Then it times, on each, the median of ``--repeat`` rounds of:

- enqueue → reply: enqueue one message, claim it and complete it with a reply as the processor does (no
  CLI), then claim and ack the reply as a channel adapter does;
- ``queue status`` (:meth:`Admin.queue_status`), ``usage`` (the CLI's default: by agent, last 7 days),
  ``trace`` of the message just answered;
- the dashboard's chat list (its first page, 50 chats) and one chat's history (its newest 50 items);

and prints each with the ratio history / near-empty. Targets: 1.5x, the chat list 2x.

    .venv/bin/python bench/history.py --backend sqlite --backend postgres
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import pg_admin
from history_sql import AGENTS, CHANNEL, statements
from measure import say, write_json

from shared.chat.address import ChatAddress
from shared.queue.core import Directory, Queue
from shared.reads.conversations import conversation_history, list_conversations
from shared.reads.trace import trace_message
from shared.reads.usage import parse_since, usage_rows
from shared.settings.model import QueueSettings
from shared.storage.db import Database
from shared.storage.schema import open_database

DAY_MS = 86_400_000
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/agentpost_bench_history"
TARGETS = {"chat list": 2.0}
TARGET = 1.5
AGENT_NAMES = tuple(f"agent-{i}" for i in range(AGENTS))


def fill(db: Database, *, messages: int, chats: int, batch: int = 50_000) -> float:
    """Load the history; returns the seconds it took."""
    t0 = time.monotonic()
    now = int(time.time() * 1000)
    oldest, newest = now - 90 * DAY_MS, now - 8 * DAY_MS
    step = max(1, (newest - oldest) // max(1, messages))
    for sql in statements(db.dialect.is_sqlite).values():
        for lo in range(0, messages, batch):
            with db.transaction() as tx:
                tx.execute(
                    sql,
                    {"lo": lo, "hi": min(messages, lo + batch), "chats": chats, "t0": oldest, "step": step},
                )
    if db.dialect.is_sqlite:  # the bulk load's WAL folded into the file, as a running system's would be
        db.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    else:  # as autovacuum would; agentpost never runs ANALYZE on SQLite
        with db.transaction() as tx:
            tx.execute("ANALYZE")
    return time.monotonic() - t0


class Ops:
    """The operations measured, over one database."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.queue = Queue(db, QueueSettings(debounce_ms=0), Directory.single(*AGENT_NAMES))
        self.n = 0
        self.last_message = ""

    def enqueue_reply(self) -> None:
        self.n += 1
        agent = AGENT_NAMES[self.n % AGENTS]
        chat = ChatAddress("api", "bench-user", conversation=f"live-{self.n % 5}")
        message_id = self.queue.intake.enqueue_message(chat, f"question {self.n}", agent=agent).message_id
        group = self.queue.messages.claim_all_pending_messages(agent, "bench-worker")
        assert [m.message_id for m in group] == [message_id], group
        outcome = self.queue.messages.complete_messages(
            [message_id], "bench-worker", "an answer", release_when_idle=True
        )
        if not outcome.released:
            self.queue.leases.release_agent(agent, "bench-worker")
        replies = self.queue.responses.claim_responses_for_channel("api", "bench-deliverer")
        assert replies, "the reply was not claimable"
        for r in replies:
            self.queue.responses.ack_response(r.id, "bench-deliverer")
        self.last_message = message_id

    def queue_status(self) -> None:
        self.queue.admin.queue_status()

    def usage(self) -> None:
        usage_rows(self.db, "agent", parse_since("7d"))

    def trace(self) -> None:
        trace = trace_message(self.db, self.last_message)
        assert trace.events, "the trace found no events"

    def chat_list(self) -> None:
        page = list_conversations(self.db, limit=50)
        assert len(page.chats) == 50 and page.next is not None, "not a full page"

    def chat_history(self) -> None:
        page = conversation_history(self.db, ChatAddress(CHANNEL, conversation="chat-7"), limit=50)
        assert page["items"], "no history"

    def all(self) -> dict[str, Callable[[], None]]:
        return {
            "enqueue -> reply": self.enqueue_reply,
            "queue status": self.queue_status,
            "usage": self.usage,
            "trace": self.trace,
            "chat list": self.chat_list,
            "chat history": self.chat_history,
        }


def measure(small: Ops, big: Ops, repeat: int) -> dict[str, dict[str, float]]:
    """Median seconds per operation on each database, rounds alternating so drifting load hits both."""
    times: dict[str, dict[str, list[float]]] = {}
    for ops in (small, big):  # warm up: caches, prepared plans, the first trace's message
        for func in ops.all().values():
            func()
    for _ in range(repeat):
        for label, ops in (("empty", small), ("history", big)):
            for name, func in ops.all().items():
                t0 = time.perf_counter()
                func()
                times.setdefault(name, {}).setdefault(label, []).append(time.perf_counter() - t0)
    return {
        name: {label: statistics.median(values) for label, values in by.items()} for name, by in times.items()
    }


def run_backend(backend: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    dbs: list[Database] = []
    urls: list[str] = []
    try:
        for label, messages, chats in (("empty", 1_200, 60), ("history", args.messages, args.chats)):
            if backend == "sqlite":
                url = f"sqlite:///{workdir / (label + '.db')}"
            else:
                url = args.pg_url.rsplit("/", 1)[0] + f"/agentpost_bench_history_{label}"
                pg_admin(url, "create")
            urls.append(url)
            db = open_database(url, create=True)
            dbs.append(db)
            seconds = fill(db, messages=messages, chats=chats)
            say(
                f"history {backend:<8} {label:<8} {messages:>9,} messages over {chats:,} chats in {seconds:.1f} s"
            )
        medians = measure(Ops(dbs[0]), Ops(dbs[1]), args.repeat)
    finally:
        for db in dbs:
            db.close()
        if backend == "postgres":
            for url in urls:
                pg_admin(url, "drop")
    out: dict[str, Any] = {}
    for name, m in medians.items():
        ratio = m["history"] / m["empty"] if m["empty"] > 0 else float("inf")
        target = TARGETS.get(name, TARGET)
        out[name] = {"empty_ms": m["empty"] * 1000, "history_ms": m["history"] * 1000, "ratio": ratio}
        say(
            f"history {backend:<8} {name:<17} empty {m['empty'] * 1000:8.2f} ms  history "
            f"{m['history'] * 1000:8.2f} ms  ratio {ratio:5.2f}x  (target {target}x) "
            f"{'ok' if ratio <= target else 'OVER'}"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", action="append", choices=["sqlite", "postgres"])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--chats", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=31)
    parser.add_argument("--pg-url", default=DEFAULT_PG)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="agentpost-history-") as tmp:
        for backend in args.backend or ["sqlite", "postgres"]:
            results[backend] = run_backend(backend, args, Path(tmp))
    write_json(args.json, results)
    over = [
        f"{b} {name}"
        for b, rows in results.items()
        for name, r in rows.items()
        if r["ratio"] > TARGETS.get(name, TARGET)
    ]
    if over:
        say("over target: " + ", ".join(over))
    return 1 if over else 0


if __name__ == "__main__":
    raise SystemExit(main())
