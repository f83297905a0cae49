"""Queue benchmark harness: producer and consumer OS processes, end-to-end throughput, lost/dup checks.

A *system* is a picklable object (no open resources until its methods run) implementing `QueueSystem`.
For every run the harness calls `setup(target)` in the parent, then starts (multiprocessing, spawn) one
producer process and K consumer processes. Each child calls the system method, which may open connections
eagerly and then returns an iterator; children signal ready, wait for a common start, then iterate:

* producer: `producer(target, messages)` yields each message id once its enqueue is committed (acked).
* consumer: `consumer(target, slot)` yields a message id after claiming it; resuming the iterator means
  "processed": the system then acks/completes it (at once or, for a batch, before its next claim).
  It yields None whenever nothing could be claimed (never block for long); the harness then sleeps a
  little or stops the consumer (`close()` on the iterator). A restarted consumer gets the same `slot`.

Every delivered id is written to a per-process log (unbuffered in the crash variant), so the parent can
classify the outcome after the run: lost, duplicated, recovered (see `classify`).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import random
import signal
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.sharedctypes import RawArray, RawValue
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/agentpost_bench"
IDLE_SLEEP_S = 0.001
ID_WIDTH = 10


@dataclass(frozen=True, slots=True)
class Msg:
    id: int
    agent: str
    body: str  # ~payload_size characters; starts with the zero-padded id, see `msg_id_of`


@runtime_checkable
class QueueSystem(Protocol):
    """What a benchmarked queue implements. Instances are pickled into spawned processes."""

    name: str
    backend: Literal["sqlite", "postgres"]  # "sqlite": target is a fresh file path; "postgres": a URL
    max_n: int | None  # cap on messages per run for slow systems (None: no cap)

    def setup(self, target: str) -> None:
        """Parent process, before each run: create a fresh, empty queue at target."""
        ...

    def producer(self, target: str, messages: Sequence[Msg]) -> Iterator[int]:
        """Producer process: enqueue each message, one operation each; yield its id once committed."""
        ...

    def consumer(self, target: str, slot: int) -> Iterator[int | None]:
        """Consumer process: yield claimed ids (ack on resume), None when nothing is claimable."""
        ...


def make_body(msg_id: int, agent: str, size: int) -> str:
    head = f"{msg_id:0{ID_WIDTH}d}|{agent}|"
    return head + "x" * max(0, size - len(head))


def msg_id_of(body: str | bytes) -> int:
    """The message id embedded at the start of a body made by `make_body`."""
    return int(body[:ID_WIDTH])


def make_messages(n: int, agents: int, payload_size: int) -> list[Msg]:
    """Message i goes to agent i % agents."""
    return [
        Msg(i, f"agent-{i % agents}", make_body(i, f"agent-{i % agents}", payload_size)) for i in range(n)
    ]


# --------------------------------------------------------------------------------------------- results


@dataclass
class RunResult:
    system: str
    variant: str
    n: int
    consumers: int
    msgs_per_s: float
    seconds: float
    enqueue_per_s: float  # the producer alone: first to last enqueue
    produced: int
    consumed: int  # distinct ids consumed
    deliveries: int  # total deliveries, duplicates included
    lost: int
    duplicated: int
    recovered: int = 0
    dup_unexplained: int = 0  # duplicates not caused by a delivery to a consumer that was then killed
    unexpected: int = 0  # consumed ids that were never produced
    kills: int = 0
    load1: float = 0.0  # 1-minute load average right after the run (2 cores here: above ~2.5 is noisy)
    error: str | None = None


@dataclass
class Variant:
    name: str
    consumers: int = 1
    n: int | None = None  # None: the series' default N
    kills: int = 0  # crash variant: number of SIGKILLs of consumer processes per run


@dataclass
class Series:
    system: str
    variant: str
    n: int
    runs: list[RunResult] = field(default_factory=list)

    @property
    def ok_runs(self) -> list[RunResult]:
        return [r for r in self.runs if r.error is None]

    def summary(self) -> dict[str, Any]:
        ok = self.ok_runs
        rates = [r.msgs_per_s for r in ok]
        return {
            "system": self.system,
            "variant": self.variant,
            "n": self.n,
            "runs": len(self.runs),
            "errors": [r.error for r in self.runs if r.error],
            "median": statistics.median(rates) if rates else None,
            "min": min(rates) if rates else None,
            "max": max(rates) if rates else None,
            "enqueue_median": statistics.median([r.enqueue_per_s for r in ok]) if ok else None,
            "lost": sum(r.lost for r in ok),
            "duplicated": sum(r.duplicated for r in ok),
            "recovered": sum(r.recovered for r in ok),
            "dup_unexplained": sum(r.dup_unexplained for r in ok),
            "unexpected": sum(r.unexpected for r in ok),
            "kills": sum(r.kills for r in ok),
            "max_load1": max((r.load1 for r in self.runs), default=0.0),
            "per_run": [asdict(r) for r in self.runs],
        }


def classify(
    produced: Iterable[int], logs: dict[tuple[int, int], list[int]], killed: set[tuple[int, int]]
) -> dict[str, int]:
    """Jepsen total-queue style check over per-incarnation delivery logs.

    logs maps (slot, incarnation) to the ids that consumer process delivered, in order.
    lost: produced (acked by the producer) but never consumed. duplicated: ids consumed more than once.
    recovered: ids delivered to a consumer process that was then SIGKILLed and delivered again by another
    process (redelivery after a crash). dup_unexplained: duplicated ids delivered more than once by
    processes that were never killed (so not explained by a crash, e.g. two live consumers got it).
    """
    acked = set(produced)
    counts: Counter[int] = Counter()
    in_killed: Counter[int] = Counter()
    for key, ids in logs.items():
        counts.update(ids)
        if key in killed:
            in_killed.update(set(ids))
    consumed = set(counts)
    dup_ids = {i for i, c in counts.items() if c > 1}
    recovered = {i for i in dup_ids if in_killed[i] >= 1}
    explained = {i for i in recovered if counts[i] - in_killed[i] <= 1}
    return {
        "consumed": len(consumed),
        "deliveries": sum(counts.values()),
        "lost": len(acked - consumed),
        "duplicated": len(dup_ids),
        "recovered": len(recovered),
        "dup_unexplained": len(dup_ids - explained),
        "unexpected": len(consumed - acked),
    }


# ------------------------------------------------------------------------------------------ child side


def _producer_main(
    system: QueueSystem, target: str, n: int, agents: int, payload_size: int, rundir: str, shared: Any
) -> None:
    rd = Path(rundir)
    try:
        messages = make_messages(n, agents, payload_size)
        it = iter(system.producer(target, messages))
        shared.ready[0] = 1
        shared.start.wait()
        acked: list[int] = []
        shared.times[0] = time.perf_counter()
        for mid in it:
            acked.append(mid)
        shared.times[1] = time.perf_counter()
        (rd / "produced.ids").write_text("\n".join(map(str, acked)))
    except BaseException:
        (rd / "error-producer.txt").write_text(traceback.format_exc())
        raise


def _consumer_main(
    system: QueueSystem, target: str, slot: int, inc: int, durable: bool, rundir: str, shared: Any
) -> None:
    rd = Path(rundir)
    log_path = rd / f"consumed-{slot}-{inc}.ids"
    try:
        it = iter(system.consumer(target, slot))
        shared.ready[slot + 1] = 1
        shared.start.wait()
        shared.running[slot] = 1
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        buf: list[int] = []
        seen, delivered, last_ack, stop = shared.seen, shared.delivered, shared.last_ack, shared.stop
        perf = time.perf_counter
        pending = False
        for item in it:
            now = perf()
            if pending:
                last_ack[slot] = now
                pending = False
            if item is None:
                if stop.value:
                    break
                time.sleep(IDLE_SLEEP_S)
                continue
            if durable:
                os.write(fd, b"%d\n" % item)
            else:
                buf.append(item)
            if 0 <= item < len(seen):
                seen[item] = 1
            delivered[slot] += 1
            pending = True
            if stop.value >= 2:
                break
        close = getattr(it, "close", None)
        if close is not None:
            close()
        if buf:
            os.write(fd, ("\n".join(map(str, buf)) + "\n").encode())
        os.close(fd)
    except BaseException:
        (rd / f"error-consumer-{slot}-{inc}.txt").write_text(traceback.format_exc())
        raise


# ----------------------------------------------------------------------------------------- parent side


class _Shared:
    """Shared memory between the parent and its children (passed to spawned processes at start)."""

    def __init__(self, ctx: Any, n: int, consumers: int) -> None:
        self.start = ctx.Event()
        self.ready = RawArray(ctypes.c_ubyte, consumers + 1)
        # A consumer past the start wait. Only those are SIGKILLed: a kill inside Event.wait() would leave the
        # Event's lock held forever and hang every later wait and the parent's start.set().
        self.running = RawArray(ctypes.c_ubyte, consumers)
        self.seen = RawArray(ctypes.c_ubyte, n)
        self.delivered = RawArray(ctypes.c_longlong, consumers)
        self.last_ack = RawArray(ctypes.c_double, consumers)
        self.times = RawArray(ctypes.c_double, 2)  # producer first-enqueue, producer done
        self.stop = RawValue(ctypes.c_int, 0)


def _read_ids(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [int(x) for x in path.read_text().split()]


def _wait_ready(shared: _Shared, idx: Sequence[int], procs: Sequence[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(shared.ready[i] for i in idx):
        if any(p.exitcode is not None for p in procs):
            raise RuntimeError("a benchmark process exited before it was ready")
        if time.monotonic() > deadline:
            raise RuntimeError("benchmark processes not ready in time")
        time.sleep(0.005)


def _errors(rundir: Path) -> str | None:
    errs = sorted(rundir.glob("error-*.txt"))
    if not errs:
        return None
    last = errs[0].read_text().strip().splitlines()
    return f"{errs[0].stem}: {last[-1] if last else '?'}"


def run_once(
    system: QueueSystem,
    target: str,
    rundir: Path,
    *,
    n: int,
    variant: str = "base",
    consumers: int = 1,
    kills: int = 0,
    agents: int = 8,
    payload_size: int = 120,
    settle_s: float = 3.0,
    timeout_s: float = 180.0,
    rng: random.Random | None = None,
) -> RunResult:
    """One run: setup, 1 producer + `consumers` consumer processes, optional SIGKILLs; returns the result.

    The run ends when every acked id has been delivered, or when nothing new was delivered for `settle_s`
    after the producer finished (lost messages), or after `timeout_s`.
    """
    rng = rng or random.Random(0)
    rundir.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    shared = _Shared(ctx, n, consumers)
    try:
        system.setup(target)
    except Exception as exc:
        return _failed(system, variant, n, consumers, f"setup: {type(exc).__name__}: {exc}")
    durable = kills > 0
    incs = [0] * consumers
    killed: set[tuple[int, int]] = set()

    def spawn_consumer(slot: int) -> Any:
        p = ctx.Process(
            target=_consumer_main,
            args=(system, target, slot, incs[slot], durable, str(rundir), shared),
            name=f"consumer-{slot}-{incs[slot]}",
            daemon=True,
        )
        p.start()
        return p

    cons = [spawn_consumer(s) for s in range(consumers)]
    prod = ctx.Process(
        target=_producer_main,
        args=(system, target, n, agents, payload_size, str(rundir), shared),
        name="producer",
        daemon=True,
    )
    prod.start()
    error: str | None = None
    try:
        try:
            _wait_ready(shared, range(consumers + 1), [prod, *cons], timeout=60.0)
        except RuntimeError as exc:
            error = _errors(rundir) or str(exc)
            return _failed(system, variant, n, consumers, error)
        shared.start.set()
        t_start = time.monotonic()
        # crash variant: SIGKILL a busy consumer when the deliveries pass random points of the run
        kill_at = sorted(int(rng.uniform(0.05, 0.85) * n) for _ in range(kills))
        missing: list[int] | None = None
        last_progress, last_total = time.monotonic(), -1
        while True:
            time.sleep(0.01)
            now = time.monotonic()
            total = sum(shared.delivered)
            if total != last_total:
                last_total, last_progress = total, now
            if prod.exitcode is not None and missing is None:
                if prod.exitcode != 0:
                    error = _errors(rundir) or f"producer exit code {prod.exitcode}"
                    break
                missing = _read_ids(rundir / "produced.ids")
            if missing is not None:
                seen = shared.seen
                missing = [i for i in missing if not seen[i]]
                if not missing or now - last_progress > settle_s:
                    break
            if now - t_start > timeout_s:
                error = f"timeout after {timeout_s:.0f}s"
                break
            for slot, p in enumerate(cons):
                if p.exitcode:
                    error = _errors(rundir) or f"consumer {slot} exit code {p.exitcode}"
            if error:
                break
            if kill_at and total >= kill_at[0] and (missing is None or missing):
                alive = [k for k, p in enumerate(cons) if p.exitcode is None and shared.running[k]]
                if alive:
                    slot = rng.choice(alive)
                    os.kill(cons[slot].pid or 0, signal.SIGKILL)
                    cons[slot].join()
                    killed.add((slot, incs[slot]))
                    kill_at.pop(0)
                    incs[slot] += 1
                    shared.ready[slot + 1] = 0
                    shared.running[slot] = 0
                    cons[slot] = spawn_consumer(slot)
    finally:
        stragglers = _join_all([prod, *cons], shared)
    if stragglers and not error:
        error = f"did not stop: {', '.join(stragglers)}"
    produced = _read_ids(rundir / "produced.ids")
    logs = {}
    for path in rundir.glob("consumed-*.ids"):
        _, slot_s, inc_s = path.stem.split("-")
        logs[(int(slot_s), int(inc_s))] = _read_ids(path)
    c = classify(produced, logs, killed)
    t0 = shared.times[0]
    t_end = max(shared.last_ack) if consumers else 0.0
    seconds = max(t_end - t0, 1e-9)
    return RunResult(
        system=system.name,
        variant=variant,
        n=n,
        consumers=consumers,
        msgs_per_s=len(produced) / seconds if c["consumed"] else 0.0,
        seconds=seconds,
        enqueue_per_s=len(produced) / max(shared.times[1] - t0, 1e-9),
        produced=len(produced),
        kills=len(killed),
        load1=os.getloadavg()[0],
        error=error,
        **c,
    )


def _failed(system: QueueSystem, variant: str, n: int, consumers: int, error: str) -> RunResult:
    return RunResult(system.name, variant, n, consumers, 0.0, 0.0, 0.0, 0, 0, 0, 0, 0, error=error)


def _join_all(procs: Sequence[Any], shared: _Shared) -> list[str]:
    """Wait for the children to leave (stop=1: at their next idle poll), then insist, then kill.

    Returns the names of the processes that had to be killed."""
    shared.start.set()  # children still waiting for the start (a failed start) leave at their first poll
    for stop, grace in ((1, 5.0), (2, 3.0)):
        shared.stop.value = stop
        deadline = time.monotonic() + grace
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        if all(p.exitcode is not None for p in procs):
            return []
    stragglers = [p for p in procs if p.exitcode is None]
    for p in stragglers:
        p.kill()
        p.join()
    return [p.name for p in stragglers]


# ---------------------------------------------------------------------------------------------- series


def target_for(system: QueueSystem, rundir: Path, pg_url: str) -> str:
    return pg_url if system.backend == "postgres" else str(rundir / "queue.db")


def effective_n(system: QueueSystem, n: int) -> int:
    cap = getattr(system, "max_n", None)
    return min(n, cap) if cap else n


def run_series(
    system: QueueSystem,
    variant: Variant,
    *,
    runs: int,
    n: int,
    workdir: Path,
    pg_url: str = DEFAULT_PG_URL,
    seed: int = 0,
    on_run: Any = None,
    **kwargs: Any,
) -> Series:
    """`runs` runs of one variant; on_run(series, result) is called after each (progress display)."""
    series = Series(system.name, variant.name, effective_n(system, variant.n or n))
    for _ in range(runs):
        run_next(system, variant, series, workdir=workdir, pg_url=pg_url, seed=seed, on_run=on_run, **kwargs)
    return series


def run_next(
    system: QueueSystem,
    variant: Variant,
    series: Series,
    *,
    workdir: Path,
    pg_url: str = DEFAULT_PG_URL,
    seed: int = 0,
    on_run: Any = None,
    **kwargs: Any,
) -> RunResult:
    """One more run of ``series`` (of ``system`` and ``variant``), appended to it; so runs of several
    systems can alternate, each series keeping its own run numbers and crash schedules."""
    k = len(series.runs)
    rundir = workdir / f"{system.name}-{variant.name}-{k}"
    result = run_once(
        system,
        target_for(system, rundir, pg_url),
        rundir,
        n=series.n,
        variant=variant.name,
        consumers=variant.consumers,
        kills=variant.kills,
        rng=random.Random(seed * 1000 + k),
        **kwargs,
    )
    series.runs.append(result)
    if on_run is not None:
        on_run(series, result)
    return result


def pg_admin(url: str, action: Literal["create", "drop"]) -> None:
    """Create (fresh) or drop the database named in url, connecting to the 'postgres' database."""
    import psycopg
    from psycopg import sql

    info = psycopg.conninfo.conninfo_to_dict(url)
    dbname = str(info.get("dbname") or "")
    if not dbname or dbname == "postgres":
        raise ValueError(f"refusing to {action} database {dbname!r}")
    admin = psycopg.conninfo.make_conninfo(url, dbname="postgres")
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        if action == "create":
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
