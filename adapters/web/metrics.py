"""``GET /metrics``: the Prometheus text format, built with ``prometheus_client`` from collectors that read at
scrape time.

:class:`SystemCollector` reads the database (:func:`shared.reads.metrics.read_figures`), so one scrape of any
web process sees the whole system: the queue, the runs the processors ended, the deliveries of the channel
adapters, cost and tokens, and every processor's and adapter's heartbeat. Figures over a recent window carry a
``window`` label (``1h``; cost and tokens also ``24h``) and are gauges: they fall as old rows leave the
window, so they are read as they are (``histogram_quantile`` without ``rate()``), not as counters.
:class:`StreamCollector` reports this web process's own live-stream clients.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from shared.reads.metrics import USAGE_WINDOWS_MS, WINDOW_MS, Buckets, SystemFigures, read_figures
from shared.storage.db import Database

from .stream import StreamStats

log = logging.getLogger("agentpost.web")

#: The content type of :meth:`Metrics.render` (the Prometheus text format, version 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The message statuses reported per agent at all times (zero when there are none), so a panel or an alert
#: has a series to read before the first message.
HELD_STATUSES = ("pending", "processing", "dead")

_WINDOW = f"{WINDOW_MS // 3_600_000}h"
_IN_WINDOW = f'in the last {WINDOW_MS // 60_000} minutes (window="{_WINDOW}")'


class SystemCollector(Collector):
    """The figures of every process, read from the database at each scrape (see the module docstring).
    ``agents`` gives the configured agents (their queue series exist even at zero)."""

    def __init__(self, db: Database, agents: Callable[[], Iterable[str]]) -> None:
        self.db = db
        self.agents = agents

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "agentpost_database_up", "1 when this scrape could read the database, 0 when it could not."
        )
        try:
            figures = read_figures(self.db)
        except Exception as exc:  # an unreachable database is what this series reports
            log.warning("metrics: cannot read the database: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _queue_families(figures, sorted(self.agents()))
        yield from _run_families(figures)
        yield from _delivery_families(figures)
        yield from _usage_families(figures)
        yield from _process_families(figures)


def _queue_families(f: SystemFigures, agents: list[str]) -> Iterator[Metric]:
    held = GaugeMetricFamily(
        "agentpost_messages",
        "Messages in the database now, by agent and status: pending (waiting, backoff included), processing "
        "(claimed by a processor), dead (dead letters not archived yet).",
        labels=["agent", "status"],
    )
    counts = {(a, s): 0 for a in agents for s in HELD_STATUSES}
    counts.update(f.messages)
    for (agent, status), n in sorted(counts.items()):
        held.add_metric([agent, status], n)
    yield held
    yield _by_agent(
        "agentpost_messages_completed", f"Messages completed {_IN_WINDOW}, by agent.", f.completed
    )
    yield _by_agent(
        "agentpost_dead_letters_new",
        f"Messages that became dead letters {_IN_WINDOW}, by agent.",
        f.dead_lettered,
    )
    oldest = GaugeMetricFamily(
        "agentpost_queue_oldest_pending_age_seconds",
        "Per agent, how long the oldest message a processor could claim now has waited since it was enqueued "
        "(agents with nothing to claim have no series).",
        labels=["agent"],
    )
    for agent, age in sorted(f.oldest_pending_seconds.items()):
        oldest.add_metric([agent], age)
    yield oldest
    yield _histogram(
        "agentpost_queue_wait_seconds",
        "Time from a message's enqueue to the start of the run that answered it, for messages completed "
        f"{_IN_WINDOW}, by agent (a gauge histogram: no rate()).",
        f.queue_wait,
    )


def _run_families(f: SystemFigures) -> Iterator[Metric]:
    runs = GaugeMetricFamily(
        "agentpost_runs",
        f"Agent runs that ended {_IN_WINDOW}, by agent and outcome (completed, failed, timed_out, stopped, "
        "interrupted), from the runs' end events.",
        labels=["agent", "outcome", "window"],
    )
    for (agent, outcome), n in sorted(f.runs.items()):
        runs.add_metric([agent, outcome, _WINDOW], n)
    yield runs
    yield _histogram(
        "agentpost_run_duration_seconds",
        f"Duration of the agent runs that ended {_IN_WINDOW}, by agent (a gauge histogram: no rate()).",
        f.run_duration,
    )
    yield _histogram(
        "agentpost_run_first_text_seconds",
        "Time from a run's start to the first text its CLI printed, for the runs that ended "
        f"{_IN_WINDOW}, by agent (a gauge histogram: no rate()).",
        f.first_text,
    )


def _delivery_families(f: SystemFigures) -> Iterator[Metric]:
    outbox = GaugeMetricFamily(
        "agentpost_responses",
        "Replies not delivered yet, by channel and status: pending, delivering, failed (the platform refused "
        "them for good; kept a week).",
        labels=["channel", "status"],
    )
    for (channel, status), n in sorted(f.responses.items()):
        outbox.add_metric([channel, status], n)
    yield outbox
    for name, text, values in (
        (
            "agentpost_deliveries",
            f"Replies delivered and acknowledged {_IN_WINDOW}, by channel.",
            f.delivered,
        ),
        (
            "agentpost_delivery_failures",
            f"Replies the platform refused for good {_IN_WINDOW}, by channel.",
            f.delivery_failures,
        ),
    ):
        family = GaugeMetricFamily(name, text, labels=["channel", "window"])
        for channel, n in sorted(values.items()):
            family.add_metric([channel, _WINDOW], n)
        yield family


def _usage_families(f: SystemFigures) -> Iterator[Metric]:
    windows = ", ".join(USAGE_WINDOWS_MS)
    cost = GaugeMetricFamily(
        "agentpost_cost_usd",
        f"Cost of agent runs in US dollars as their CLI reported it, by agent, over the last {windows} "
        "(window label).",
        labels=["agent", "window"],
    )
    tokens = GaugeMetricFamily(
        "agentpost_tokens",
        f"Tokens of agent runs by agent and kind (input, output, cache_read, cache_write), over the last "
        f"{windows} (window label).",
        labels=["agent", "kind", "window"],
    )
    for window, rows in f.usage.items():
        for r in sorted(rows, key=lambda r: r.key):
            cost.add_metric([r.key, window], r.cost_usd)
            for kind, value in (
                ("input", r.input_tokens),
                ("output", r.output_tokens),
                ("cache_read", r.cache_read_tokens),
                ("cache_write", r.cache_write_tokens),
            ):
                tokens.add_metric([r.key, kind, window], value)
    yield cost
    yield tokens


def _process_families(f: SystemFigures) -> Iterator[Metric]:
    up = GaugeMetricFamily(
        "agentpost_process_up",
        "1 while a processor, scheduler or channel adapter runs (and an adapter is connected to its platform), 0 "
        "when its heartbeat says it stopped or went silent; kind: processor, scheduler or channel, name: the "
        "process's worker id (host:pid:start) or the channel.",
        labels=["kind", "name"],
    )
    age = GaugeMetricFamily(
        "agentpost_process_heartbeat_age_seconds",
        "Seconds since a processor, scheduler or channel adapter last wrote its heartbeat row (about every 60 s "
        "while it runs).",
        labels=["kind", "name"],
    )
    for p in sorted(f.processes, key=lambda p: (p.kind, p.name)):
        up.add_metric([p.kind, p.name], 1 if p.up else 0)
        age.add_metric([p.kind, p.name], p.age_seconds)
    yield up
    yield age
    if f.database_bytes is not None:
        yield GaugeMetricFamily(
            "agentpost_database_size_bytes",
            "Size of the database on disk (SQLite: the file and its write-ahead log; PostgreSQL: "
            "pg_database_size).",
            value=f.database_bytes,
        )
    yield GaugeMetricFamily(
        "agentpost_metrics_read_seconds",
        "How long this scrape took to read the database.",
        value=f.read_seconds,
    )


def _by_agent(name: str, text: str, values: dict[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, text, labels=["agent", "window"])
    for agent, n in sorted(values.items()):
        family.add_metric([agent, _WINDOW], n)
    return family


def _histogram(name: str, text: str, by_agent: dict[str, Buckets]) -> GaugeHistogramMetricFamily:
    family = GaugeHistogramMetricFamily(name, text, labels=["agent", "window"])
    for agent, buckets in sorted(by_agent.items()):
        family.add_metric([agent, _WINDOW], buckets.cumulative(), buckets.total)
    return family


class StreamCollector(Collector):
    """This web process's own live-stream clients (the one part of ``/metrics`` that is per process)."""

    def __init__(self, stats: StreamStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        st = self.stats
        yield GaugeMetricFamily(
            "agentpost_stream_clients", "Live-stream clients connected to this web process.", value=st.clients
        )
        for name, text, value in (
            (
                "agentpost_stream_connections",
                "Live-stream connections to this web process.",
                st.connections_total,
            ),
            (
                "agentpost_stream_events_sent",
                "Events this web process sent to stream clients.",
                st.events_sent_total,
            ),
            (
                "agentpost_stream_slow_disconnects",
                "Stream clients this web process cut off because they accepted no data in time",
                st.slow_disconnects_total,
            ),
            (
                "agentpost_stream_resets",
                "Reset notices this web process sent for expired cursors",
                st.resets_total,
            ),
        ):
            yield CounterMetricFamily(name, text + " since it started.", value=value)


class Metrics:
    """The registry ``/metrics`` renders: the system's figures and this process's streams."""

    def __init__(self, db: Database, agents: Callable[[], Iterable[str]], stream_stats: StreamStats) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SystemCollector(db, agents))
        self.registry.register(StreamCollector(stream_stats))

    def render(self) -> bytes:
        """The exposition text (call from a worker thread: it reads the database)."""
        return generate_latest(self.registry)
