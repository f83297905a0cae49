"""``GET /metrics`` (adapters.web.metrics) against a real uvicorn server over a real database: the token is
asked for, and every series holds what the queue API, the run end events, the usage rows and the heartbeat
rows the test wrote say — the figures of the other processes, read from the database by the web process."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shared.chat import health
from shared.chat.address import ChatAddress
from shared.events.log import PendingEvent, append_events
from shared.queue import presence
from shared.reads.metrics import read_figures
from shared.reads.usage import UsageRecord, record_usage_in
from shared.runtime import Runtime
from shared.storage.db import Tx
from shared.storage.schema import open_database
from shared.worker_identity import this_host
from tests.web_support import REPO, LiveServer, assert_refused, make_home, runtime_for

pytestmark = pytest.mark.integration

Series = dict[str, dict[frozenset[tuple[str, str]], float]]


def scrape(client: httpx.Client) -> Series:
    """Every sample of one scrape, by sample name and label set (parsed as Prometheus would)."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    found: Series = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return found


def value(series: Series, metric: str, /, **labels: str) -> float:
    """The sample ``metric`` with exactly ``labels`` (fails, listing the label sets scraped, when absent)."""
    samples = series.get(metric, {})
    key = frozenset(labels.items())
    assert key in samples, f"{metric}{labels} not scraped; it has {[dict(k) for k in samples]}"
    return samples[key]


def _run_end(message_id: str, agent: str, **payload: Any) -> Any:
    """What a run's end writes with its outcome (workers.outcome.RunEnd): its end event and its usage."""

    def write(tx: Tx) -> None:
        done = {"agent": agent, "message_ids": [message_id], "run_id": f"run_{message_id}", **payload}
        append_events(tx, [PendingEvent("chain_step_done", done, message_id, topic="queue")])
        if payload.get("ok"):
            record = UsageRecord(
                agent=agent,
                message_id=message_id,
                channel="web",
                input_tokens=10,
                output_tokens=7,
                cost_usd=0.25,
                duration_ms=int(payload["duration_ms"]),
            )
            record_usage_in(tx, record)

    return write


@pytest.fixture
def rt(tmp_path: Path, db_url: str) -> Iterator[Runtime]:
    runtime = runtime_for(make_home(tmp_path, db_url=db_url, max_retries=3))
    yield runtime
    runtime.close()


def test_metrics_ask_for_the_token_and_report_what_every_process_wrote(rt: Runtime) -> None:
    q = rt.queue
    with LiveServer(rt) as live, live.client() as client:
        with live.client(token="") as anon:
            assert_refused(anon.get("/metrics"), 401, "token")
        with live.client(token="wrong") as wrong:
            assert_refused(wrong.get("/metrics"), 401, "token")

        # Two messages for alpha, through the API, run and completed as the processor does it.
        for text in ("first", "second"):
            assert client.post("/api/message", json={"message": text, "agent": "alpha"}).status_code == 201
        claimed = q.messages.claim_all_pending_messages("alpha", "proc-1")
        assert len(claimed) == 2
        q.messages.mark_run_started([m.message_id for m in claimed], "proc-1")
        for m, duration in zip(claimed, (1500, 4000), strict=True):
            end = _run_end(m.message_id, "alpha", ok=True, duration_ms=duration, first_text_ms=300)
            q.messages.complete_messages([m.message_id], "proc-1", f"answer to {m.message}", also=end)
        q.leases.release_agent("alpha", "proc-1")

        # beta: a run that failed (retried later); gamma: a run that failed for good (a dead letter).
        address = ChatAddress("telegram", "ann", sender_id="7", conversation="42")
        failed = q.intake.enqueue_message(address, "will fail", agent="beta")
        (m,) = q.messages.claim_all_pending_messages("beta", "proc-1")
        q.failures.fail_messages(
            [m.message_id], "proc-1", "exit 1", also=_run_end(m.message_id, "beta", ok=False, duration_ms=800)
        )
        q.leases.release_agent("beta", "proc-1")
        dead = q.intake.enqueue_message(address, "will die", agent="gamma")
        (m,) = q.messages.claim_all_pending_messages("gamma", "proc-1")
        q.failures.fail_messages(
            [m.message_id],
            "proc-1",
            "the CLI cannot start",
            permanent=True,
            also=_run_end(m.message_id, "gamma", ok=False, duration_ms=50, timed_out=True, stopped_by="idle"),
        )

        # Deliveries: telegram's reply acked, discord's refused for good; one web reply still pending.
        q.responses.enqueue_response(address, "delivered")
        (r,) = q.responses.claim_responses_for_channel("telegram", "tg")
        assert q.responses.mark_chunk_delivered(r.id, "tg", 0, platform_id="1", ack=True)
        q.responses.enqueue_response(ChatAddress("discord", "bob", conversation="9"), "refused")
        (r,) = q.responses.claim_responses_for_channel("discord", "dc")
        assert q.responses.fail_response(r.id, "Forbidden", worker="dc")

        # Heartbeats: a processor on another host, one of this host that is gone, a connected adapter.
        presence.announce(rt.db, "otherhost:4242:17", 4242, ["alpha"])
        presence.announce(rt.db, f"{this_host()}:999999999:1", 999999999, ["beta"])
        presence.announce_scheduler(rt.db, "otherhost:5151:3", 5151)
        health.report(rt.db, "telegram", "up", worker="otherhost:77:1")

        waiting = q.intake.enqueue_message(address, "still waiting", agent="alpha")
        s = scrape(client)

    assert value(s, "agentpost_database_up") == 1
    # Messages held now, by agent and status (configured agents at zero too).
    assert value(s, "agentpost_messages", agent="alpha", status="pending") == 1
    assert value(s, "agentpost_messages", agent="alpha", status="processing") == 0
    assert value(s, "agentpost_messages", agent="beta", status="pending") == 1  # back for its retry
    assert value(s, "agentpost_messages", agent="gamma", status="dead") == 1
    assert value(s, "agentpost_messages_completed", agent="alpha", window="1h") == 2
    assert value(s, "agentpost_dead_letters_new", agent="gamma", window="1h") == 1
    assert rt.queue.admin.get_message(dead.message_id).status == "dead"  # type: ignore[union-attr]
    assert rt.queue.admin.get_message(failed.message_id).retry_count == 1  # type: ignore[union-attr]
    assert 0 <= value(s, "agentpost_queue_oldest_pending_age_seconds", agent="alpha") < 60
    assert waiting.message_id
    # Queue wait: both of alpha's messages waited from their enqueue to their run's start.
    assert value(s, "agentpost_queue_wait_seconds_gcount", agent="alpha", window="1h") == 2
    assert value(s, "agentpost_queue_wait_seconds_bucket", agent="alpha", window="1h", le="+Inf") == 2
    # Runs by outcome, their durations and time to first text, from the end events.
    assert value(s, "agentpost_runs", agent="alpha", outcome="completed", window="1h") == 2
    assert value(s, "agentpost_runs", agent="beta", outcome="failed", window="1h") == 1
    assert value(s, "agentpost_runs", agent="gamma", outcome="timed_out", window="1h") == 1
    duration = "agentpost_run_duration_seconds_bucket"
    assert value(s, duration, agent="alpha", window="1h", le="1") == 0
    assert value(s, duration, agent="alpha", window="1h", le="2.5") == 1
    assert value(s, duration, agent="alpha", window="1h", le="5") == 2
    assert value(s, "agentpost_run_duration_seconds_gsum", agent="alpha", window="1h") == 5.5
    assert value(s, "agentpost_run_first_text_seconds_bucket", agent="alpha", window="1h", le="1") == 2
    assert value(s, "agentpost_run_first_text_seconds_gsum", agent="alpha", window="1h") == pytest.approx(0.6)
    # Deliveries and their failures per channel; the outbox now.
    assert value(s, "agentpost_deliveries", channel="telegram", window="1h") == 1
    assert value(s, "agentpost_delivery_failures", channel="discord", window="1h") == 1
    assert value(s, "agentpost_responses", channel="discord", status="failed") == 1
    assert value(s, "agentpost_responses", channel="web", status="pending") == 2  # alpha's two answers
    # Cost and tokens per agent, from the usage rows.
    for window in ("1h", "24h"):
        assert value(s, "agentpost_cost_usd", agent="alpha", window=window) == 0.5
        assert value(s, "agentpost_tokens", agent="alpha", kind="output", window=window) == 14
    # Liveness of the processes that have no HTTP port.
    assert value(s, "agentpost_process_up", kind="processor", name="otherhost:4242:17") == 1
    assert (
        value(s, "agentpost_process_heartbeat_age_seconds", kind="processor", name="otherhost:4242:17") < 60
    )
    assert value(s, "agentpost_process_up", kind="processor", name=f"{this_host()}:999999999:1") == 0
    assert value(s, "agentpost_process_up", kind="channel", name="telegram") == 1
    assert value(s, "agentpost_process_up", kind="scheduler", name="otherhost:5151:3") == 1
    # The Grafana dashboard reads only series the scrape has.
    dashboard = json.loads((REPO / "deploy" / "grafana" / "agentpost.json").read_text(encoding="utf-8"))
    expressions = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert {"stat", "timeseries"} <= {panel["type"] for panel in dashboard["panels"]}
    used = {name for e in expressions for name in re.findall(r"agentpost_[a-z_]+", e)}
    assert len(used) >= 15 and used <= set(s), f"the dashboard reads series /metrics lacks: {used - set(s)}"
    # The database's size on disk.
    size = value(s, "agentpost_database_size_bytes")
    if rt.db.dialect.is_sqlite:
        path = rt.db.url.removeprefix("sqlite:///")
        assert size >= os.path.getsize(path) > 0
    else:
        assert size > 1_000_000


#: Partial indexes whose rows are the open ones (pending, processing, undelivered) or the dead letters: their
#: size follows the load and the archive policy, not the history, so a scrape may read them whole.
OPEN_ROW_INDEXES = ("ix_messages_pending", "ix_messages_processing", "ix_messages_dead", "ix_responses_open")


def test_a_scrape_reads_growing_tables_only_through_indexes(tmp_path: Path) -> None:
    """What keeps a scrape's cost flat as history grows: no statement of :func:`read_figures` scans a table
    whose rows pile up (SQLite's plans, as in test_hot_path_plans)."""
    db = open_database(f"sqlite:///{tmp_path}/a.db")
    captured: list[str] = []
    conn: sqlite3.Connection = db.connection()
    conn.set_trace_callback(captured.append)
    try:
        figures = read_figures(db)
    finally:
        conn.set_trace_callback(None)
    assert figures.database_bytes is not None and figures.database_bytes > 0
    statements = [s for s in captured if s.lstrip().upper().startswith("SELECT")]
    assert len(statements) >= 10  # the capture works: the scrape ran its reads through this connection
    scans = []
    for sql in statements:
        plan = " | ".join(str(r["detail"]) for r in db.read("EXPLAIN QUERY PLAN " + sql))
        for table in ("messages", "responses", "events", "run_usage"):
            for step in plan.split(" | "):
                # Reading a whole index is a scan too, unless the index holds only open rows or dead letters.
                if step.startswith(f"SCAN {table}") and not any(ix in step for ix in OPEN_ROW_INDEXES):
                    scans.append(f"{sql}\n    -> {plan}")
    db.close()
    assert scans == [], "full scans in a scrape:\n" + "\n".join(scans)
