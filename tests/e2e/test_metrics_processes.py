"""One scrape of the web app shows what another process did: ``agentpost run processor`` runs a ``command``
agent as its own OS process, the web app (a real uvicorn server in the test's process) serves ``/metrics``, and
the run, its duration, its time to first text and the processor's heartbeat reach the scrape through the
database alone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.probes import kill_all
from tests.processor_support import agent_script, command_agent, make_home, wait_for
from tests.web_support import AGENTPOST, LiveServer, runtime_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@pytest.fixture
def processor(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    home = make_home(
        tmp_path, f"sqlite:///{tmp_path / 'agentpost.db'}", {"solo": command_agent(agent_script(tmp_path))}
    )
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "AGENTPOST_HOME": str(home)}
    out = open(tmp_path / "processor.out", "wb")  # noqa: SIM115 - closed once the process has it
    proc = subprocess.Popen([AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    try:
        yield home, proc
    finally:
        kill_all([proc])


def _samples(client: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def test_the_web_scrape_shows_the_processor_process_run_and_heartbeat(
    processor: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    home, proc = processor
    rt = runtime_for(home)
    try:
        with LiveServer(rt) as live, live.client() as client:
            with live.client(token="") as anon:
                assert anon.get("/metrics").status_code == 401
            posted = client.post("/api/message", json={"message": "hello there", "agent": "solo"})
            assert posted.status_code == 201, posted.text
            run = frozenset({("agent", "solo"), ("window", "1h")})

            def ran() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
                found = _samples(client)
                done = found.get(("agentpost_runs", run | {("outcome", "completed")}), 0)
                return found if done == 1 else None

            samples = wait_for(ran, 60, "the processor's run to show in the scrape")
    finally:
        rt.close()
    assert samples[("agentpost_messages_completed", run)] == 1
    assert samples[("agentpost_run_duration_seconds_gcount", run)] == 1
    assert 0 < samples[("agentpost_run_duration_seconds_gsum", run)] < 30
    # The scripted CLI printed its reply line: the run's first text, timed from its start.
    assert samples[("agentpost_run_first_text_seconds_gcount", run)] == 1
    assert samples[("agentpost_queue_wait_seconds_gcount", run)] == 1
    beats = {
        dict(labels)["name"]: value
        for (name, labels), value in samples.items()
        if name == "agentpost_process_up" and dict(labels)["kind"] == "processor"
    }
    assert [int(name.split(":")[1]) for name in beats] == [proc.pid] and list(beats.values()) == [1]
    assert proc.poll() is None
