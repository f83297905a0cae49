"""A reply that could not be delivered shows up where operators look: the metrics served by the web
process (the failed replies now and within the last hour), ``doctor`` (with the platform's reason and the reference), and ``trace``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.cli.doctor import run_checks
from shared.reads.trace import trace_message
from shared.runtime import Runtime
from tests.web_support import LiveServer, make_home, runtime_for

pytestmark = pytest.mark.integration


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return make_home(tmp_path)


@pytest.fixture
def rt(home: Path) -> Iterator[Runtime]:
    runtime = runtime_for(home)
    yield runtime
    runtime.close()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the metrics")


def test_failed_deliveries_in_metrics_doctor_and_trace(home: Path, rt: Runtime) -> None:
    before = [c for c in run_checks(home) if c.area == "delivery"]
    assert [(c.level, c.name) for c in before] == [("ok", "failed replies")]
    with LiveServer(rt) as live, live.client() as client:
        reply = rt.queue.responses.enqueue_response(
            ChatAddress("telegram", "ann", conversation="42"), "hello"
        )
        [claimed] = rt.queue.responses.claim_responses_for_channel("telegram", "tg")
        assert rt.queue.responses.fail_response(
            claimed.id, "Telegram: Forbidden: bot was blocked by the user", worker="tg", explanation="blocked"
        )
        text = client.get("/metrics").text
    assert _metric(text, 'agentpost_responses{channel="telegram",status="failed"}') == 1
    assert _metric(text, 'agentpost_delivery_failures{channel="telegram",window="1h"}') == 1
    [check] = [c for c in run_checks(home) if c.area == "delivery"]
    assert check.level == "warn" and "1 reply could not be delivered" in check.detail
    assert reply.message_id in check.detail and "blocked by the user" in check.detail
    verdict = trace_message(rt.db, reply.message_id).verdict
    assert verdict.startswith("the reply could not be delivered on telegram: Telegram: Forbidden")
