"""Sample what PostgreSQL sessions of one database wait for, while a benchmark runs against it.

Every few milliseconds it reads ``pg_stat_activity`` (state, wait event, the statement) and the ungranted
locks in ``pg_locks`` of the database's client sessions, then prints how often each state and wait was seen
(per sample: the average number of sessions in it) and the statements behind the waits. Start it beside the
run, on the database the run uses:

    (sleep 5; bench/.venv/bin/python bench/pg_waits.py --db agentpost_bench_x --seconds 10) &
    bench/.venv/bin/python bench/run_peers.py --only agentpost-pg --add systems_agentpost:AgentpostPostgres \\
        --variants c4 --runs 2 --pg-url postgresql://postgres@127.0.0.1:5432/agentpost_bench_x

"idle in transaction / ClientRead" is a transaction left open while its client works (or waits for a CPU);
"Lock / advisory", "Lock / transactionid", "Lock / object" are sessions queued behind another transaction.
"""

from __future__ import annotations

import argparse
import collections
import time

import psycopg

_ACTIVITY = (
    "SELECT state, COALESCE(wait_event_type, 'CPU'), COALESCE(wait_event, '-'), "
    "left(regexp_replace(query, '\\s+', ' ', 'g'), 90) FROM pg_stat_activity "
    "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
)
_WAITING = "SELECT l.locktype FROM pg_locks l JOIN pg_stat_activity a USING (pid) WHERE a.datname = %s AND NOT l.granted"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="the database the benchmark runs against")
    p.add_argument("--seconds", type=float, default=10.0, help="how long to sample (default 10)")
    p.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = p.parse_args()
    waits: collections.Counter[tuple[str, str, str]] = collections.Counter()
    statements: collections.Counter[tuple[str, str, str]] = collections.Counter()
    locks: collections.Counter[str] = collections.Counter()
    samples = 0
    with psycopg.connect(args.admin_url, autocommit=True) as conn:
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            rows = conn.execute(_ACTIVITY, (args.db,)).fetchall()
            if not rows:  # the run has not started yet, or is between runs
                time.sleep(0.01)
                continue
            samples += 1
            for state, kind, event, query in rows:
                if state == "idle":
                    waits[("idle (between transactions)", "", "")] += 1
                    continue
                waits[(state, kind, event)] += 1
                statements[(kind, event, query)] += 1
            for (locktype,) in conn.execute(_WAITING, (args.db,)).fetchall():
                locks[locktype] += 1
            time.sleep(0.005)
    print(f"samples: {samples}")
    for key, n in waits.most_common():
        print(f"{n:7d}  {n / max(1, samples):5.2f}/sample  {' / '.join(k for k in key if k)}")
    print("statements (not idle):")
    for key, n in statements.most_common(20):
        print(f"{n:7d}  {key[0]} / {key[1]}: {key[2]}")
    print(f"ungranted locks: {dict(locks)}")


if __name__ == "__main__":
    main()
