"""The loss test seed 001's authors never committed: ``agentpost run web`` as its own process, another process
appending 2,000 events, and an SSE client whose connection is cut mid-stream again and again. The client must
end with exactly events 1..2,000, in order: no gap, no duplicate."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.web_support import REPO, SseReader, free_port, make_home, web_process

pytestmark = pytest.mark.e2e

TOTAL = 2000

# Another OS process appends the events through the real event log, in small paced bursts, so that the
# cuts below land while it is still writing. It waits for the go file so the client is connected first.
APPENDER = """
import sys, time
from pathlib import Path
from shared.runtime import open_runtime
home, go, total = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
while not go.exists():
    time.sleep(0.01)
rt = open_runtime(home)
for n in range(1, total + 1):
    rt.events.append("loss", "tick", {"n": n})
    if n % 25 == 0:
        time.sleep(0.02)
rt.close()
"""


def run_loss_test(
    tmp_path: Path, db_url: str | None, *, home: Path | None = None, extra_env: dict[str, str] | None = None
) -> None:
    home = home or make_home(tmp_path, db_url=db_url)
    port = free_port()
    go = tmp_path / "go"
    with web_process(home, port, **(extra_env or {})):
        appender = subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(home), str(go), str(TOTAL)], cwd=REPO, env=_env(home)
        )
        received: list[int] = []
        cursors: list[int] = []
        last_id: str | None = None
        cuts = cuts_while_appending = 0
        deadline = time.monotonic() + 90
        try:
            while len(received) < TOTAL and time.monotonic() < deadline:
                headers = {"Last-Event-ID": last_id} if last_id else {}
                path = "/api/events/stream?topic=loss" + ("" if last_id else "&after=0")
                reader = SseReader(port, path, headers=headers)
                go.touch()
                # Cut after a varying number of events: the socket is closed with whatever partial frame
                # it holds, exactly like a dropped mobile connection.
                budget = 97 + 61 * cuts
                try:
                    for ev in reader.events(timeout=2):
                        if ev.get("event") == "reset":
                            raise AssertionError(f"unexpected reset: {ev}")
                        data = json.loads(ev["data"])
                        received.append(int(data["payload"]["n"]))
                        cursors.append(int(ev["id"]))
                        last_id = ev["id"]
                        budget -= 1
                        if budget <= 0:
                            break
                finally:
                    reader.close()
                if len(received) < TOTAL:
                    cuts += 1
                    if appender.poll() is None:
                        cuts_while_appending += 1
            assert appender.wait(timeout=60) == 0
        finally:
            if appender.poll() is None:
                appender.kill()
                appender.wait()
    assert cuts >= 5, f"only {cuts} cuts"
    assert cuts_while_appending >= 3, f"only {cuts_while_appending} cuts happened while events were appended"
    assert received == list(range(1, TOTAL + 1))
    assert cursors == sorted(set(cursors))


def _env(home: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env["AGENTPOST_HOME"] = str(home)
    return env


def test_sse_loss_free_across_cuts_sqlite(tmp_path: Path) -> None:
    run_loss_test(tmp_path, None)


@pytest.mark.postgres
def test_sse_loss_free_across_cuts_postgresql(tmp_path: Path, pg_url: str) -> None:
    run_loss_test(tmp_path, pg_url)


def test_web_refuses_non_loopback_without_token(tmp_path: Path) -> None:
    # No token is only had by asking for open loopback (otherwise one is made in the home).
    home = make_home(tmp_path, extra="\n[api]\nallow_open_loopback = true\n")
    env = _env(home) | {"AGENTPOST_API_HOST": "0.0.0.0", "AGENTPOST_API_PORT": str(free_port())}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "agentpost"), "run", "web"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "refusing to listen on '0.0.0.0' without an API token" in " ".join(result.stderr.split())
    assert "AGENTPOST_API_TOKEN" in result.stderr and "allow_open_loopback" in result.stderr


@pytest.mark.redis
def test_sse_loss_free_with_redis_driver(tmp_path: Path) -> None:
    """The same loss test with ``events.driver = "redis"``: the web process reads the relayed Redis streams."""
    import os
    import secrets

    from shared.events.redis_driver import RedisEventLog

    prefix = f"agentpost-test-{secrets.token_hex(6)}"
    redis_url = os.environ.get("AGENTPOST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    extra_env = {"AGENTPOST_REDIS_URL": redis_url, "AGENTPOST_REDIS_PREFIX": prefix}
    home = make_home(tmp_path, extra='\n[events]\ndriver = "redis"\n')
    log = RedisEventLog.from_url(redis_url, prefix)
    try:
        log.client.ping()
    except Exception as exc:
        pytest.skip(f"Redis unavailable: {exc}")
    try:
        run_loss_test(tmp_path, None, home=home, extra_env=extra_env)
        assert int(log.last_cursor()) >= TOTAL  # the stream really went through Redis
    finally:
        log.destroy()
        log.close()
