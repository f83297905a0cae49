"""``GET /metrics`` in the Prometheus text format (version 0.0.4), written by hand: a few gauges and counters
need no client library.

Gauges (queue depths) are read from the database at scrape time. Counters (throughput, failures, agent run
time) are derived from the event log: each scrape reads the events appended since the previous one, so the
counters count from this process's start, as Prometheus counters do, and every web process reports the same
system-wide figures.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable

from shared.events.entries import CursorExpired, EventEntry
from shared.queue.core import Queue
from shared.reads.usage import usage_rows
from shared.storage.statuses import MessageStatus, ResponseStatus

from .stream import ReadableLog, StreamStats

#: Event types counted as throughput, and the counter each feeds.
_COUNTED = {
    "message_received": "agentpost_messages_received_total",
    "response_ready": "agentpost_messages_completed_total",
    "message_completed": "agentpost_messages_completed_total",
    "message_failed": "agentpost_messages_failed_total",
    "message_dead": "agentpost_messages_dead_total",
    "response_acked": "agentpost_responses_acked_total",
    "response_failed": "agentpost_responses_failed_total",
}
_HELP = {
    "agentpost_messages_received_total": "Messages accepted into the queue.",
    "agentpost_messages_completed_total": "Claimed message groups completed (with or without a response).",
    "agentpost_messages_failed_total": "Failed attempts that were scheduled for a retry.",
    "agentpost_messages_dead_total": "Messages that became dead letters.",
    "agentpost_responses_acked_total": "Responses delivered and acknowledged.",
    "agentpost_responses_failed_total": "Responses the platform refused for good or reported failed (not delivered).",
}
_MAX_OPEN_RUNS = 10_000
_MAX_EVENTS_PER_SCRAPE = 50_000


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, str]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in pairs.items()) + "}"


class Metrics:
    """Collects and renders the metrics of one web process."""

    def __init__(self, queue: Queue, events: ReadableLog, stream_stats: StreamStats) -> None:
        self.queue = queue
        self.events = events
        self.stream_stats = stream_stats
        self._lock = threading.Lock()
        self._cursor: str | None = None
        self._counters: dict[str, int] = dict.fromkeys(_HELP, 0)
        self._events_by_type: dict[str, int] = {}
        # message id -> (agent, claimed at ms): runs in flight, to time them when they end.
        self._open_runs: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._run_sum: dict[str, float] = {}
        self._run_count: dict[str, int] = {}

    def start(self) -> None:
        """Count from now on (events already in the log are history, not this process's throughput)."""
        with self._lock:
            self._cursor = self.events.last_cursor()

    def _observe(self, entry: EventEntry) -> None:
        self._events_by_type[entry.type] = self._events_by_type.get(entry.type, 0) + 1
        counter = _COUNTED.get(entry.type)
        if counter is not None:
            self._counters[counter] += 1
        if entry.type == "message_claimed":
            agent = str(entry.payload.get("agent", ""))
            ids = entry.payload.get("message_ids") or [entry.message_id]
            for mid in ids:
                if isinstance(mid, str):
                    self._open_runs[mid] = (agent, entry.created_at)
            while len(self._open_runs) > _MAX_OPEN_RUNS:
                self._open_runs.popitem(last=False)
        elif entry.type in ("response_ready", "message_completed", "message_failed", "message_dead"):
            if entry.message_id is None:
                return
            started = self._open_runs.pop(entry.message_id, None)
            if started is None:
                return
            agent, at = started
            for mid in entry.payload.get("message_ids") or []:
                if isinstance(mid, str):
                    self._open_runs.pop(mid, None)
            self._run_sum[agent] = self._run_sum.get(agent, 0.0) + max(0, entry.created_at - at) / 1000
            self._run_count[agent] = self._run_count.get(agent, 0) + 1

    def _catch_up(self) -> None:
        if self._cursor is None:
            self._cursor = self.events.last_cursor()
            return
        seen = 0
        while seen < _MAX_EVENTS_PER_SCRAPE:
            try:
                batch = self.events.read(None, self._cursor, 1000)
            except CursorExpired as exc:
                self._cursor = exc.retained_after
                continue
            for entry in batch:
                self._observe(entry)
            seen += len(batch)
            if batch:
                self._cursor = batch[-1].cursor
            if len(batch) < 1000:
                break

    def render(self) -> str:
        """The exposition text (call from a worker thread: it reads the database)."""
        with self._lock:
            self._catch_up()
            lines: list[str] = []
            self._queue_families(lines)
            self._counter_families(lines)
            self._usage_families(lines)
            self._stream_families(lines)
            return "\n".join(lines) + "\n"

    def _queue_families(self, lines: list[str]) -> None:
        status = self.queue.admin.queue_status()
        depths = self.queue.admin.agent_queue_depths()
        _family(lines, "agentpost_up", "gauge", "1 while the web process can read the database.", [({}, 1)])
        _family(
            lines,
            "agentpost_queue_messages",
            "gauge",
            "Messages by status.",
            [({"status": s.value}, float(status.get(s, 0))) for s in MessageStatus],
        )
        _family(
            lines,
            "agentpost_queue_responses",
            "gauge",
            "Undelivered responses by status (failed: the platform refused them for good).",
            [
                (
                    {"status": ResponseStatus.PENDING.value},
                    float(status.get(f"responses_{ResponseStatus.PENDING}", 0)),
                ),
                (
                    {"status": ResponseStatus.DELIVERING.value},
                    float(status.get(f"responses_{ResponseStatus.DELIVERING}", 0)),
                ),
                (
                    {"status": ResponseStatus.FAILED.value},
                    float(status.get(f"responses_{ResponseStatus.FAILED}", 0)),
                ),
            ],
        )
        _family(
            lines,
            "agentpost_agent_queue_depth",
            "gauge",
            "Pending and processing messages per agent.",
            [
                ({"agent": str(d["agent"]), "status": s.value}, float(d[s]))
                for d in depths
                for s in (MessageStatus.PENDING, MessageStatus.PROCESSING)
            ],
        )

    def _counter_families(self, lines: list[str]) -> None:
        for name, help_text in _HELP.items():
            _family(
                lines,
                name,
                "counter",
                help_text + " (since this process started)",
                [({}, self._counters[name])],
            )
        _family(
            lines,
            "agentpost_events_total",
            "counter",
            "Events appended to the log, by type (since this process started).",
            [({"type": t}, float(n)) for t, n in sorted(self._events_by_type.items())],
        )
        lines.append("# HELP agentpost_agent_run_seconds Time from claim to completion or failure per agent.")
        lines.append("# TYPE agentpost_agent_run_seconds summary")
        for agent in sorted(self._run_count):
            labels = _labels({"agent": agent})
            lines.append(f"agentpost_agent_run_seconds_sum{labels} {self._run_sum[agent]:g}")
            lines.append(f"agentpost_agent_run_seconds_count{labels} {self._run_count[agent]}")

    def _usage_families(self, lines: list[str]) -> None:
        # Sums of the run_usage table, whose rows are never removed: counters over agentpost's whole life,
        # the same in every web process (not "since this process started" like the event counters).
        rows = usage_rows(self.queue.db, "agent")
        _family(
            lines,
            "agentpost_agent_cost_usd_total",
            "counter",
            "Cost of agent runs in US dollars, as the claude CLI reported it, per agent.",
            [({"agent": r.key}, r.cost_usd) for r in rows],
        )
        _family(
            lines,
            "agentpost_agent_tokens_total",
            "counter",
            "Tokens of agent runs per agent and kind (input, output, cache_read, cache_write).",
            [
                ({"agent": r.key, "kind": kind}, float(value))
                for r in rows
                for kind, value in (
                    ("input", r.input_tokens),
                    ("output", r.output_tokens),
                    ("cache_read", r.cache_read_tokens),
                    ("cache_write", r.cache_write_tokens),
                )
            ],
        )
        _family(
            lines,
            "agentpost_agent_runs_recorded_total",
            "counter",
            "Agent runs whose usage was recorded, per agent.",
            [({"agent": r.key}, float(r.runs)) for r in rows],
        )

    def _stream_families(self, lines: list[str]) -> None:
        st = self.stream_stats
        for name, kind, help_text, value in [
            ("agentpost_stream_clients", "gauge", "Connected live-stream clients.", st.clients),
            (
                "agentpost_stream_connections_total",
                "counter",
                "Live-stream connections.",
                st.connections_total,
            ),
            (
                "agentpost_stream_events_sent_total",
                "counter",
                "Events sent to stream clients.",
                st.events_sent_total,
            ),
            (
                "agentpost_stream_slow_disconnects_total",
                "counter",
                "Stream clients cut off because they accepted no data in time.",
                st.slow_disconnects_total,
            ),
            (
                "agentpost_stream_resets_total",
                "counter",
                "Reset notices sent for expired cursors.",
                st.resets_total,
            ),
        ]:
            _family(lines, name, kind, help_text, [({}, value)])


def _family(
    lines: list[str], name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]
) -> None:
    """One metric family in the exposition format: its HELP and TYPE lines, then its samples."""
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        lines.append(f"{name}{_labels(labels)} {value:g}")
