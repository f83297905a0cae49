"""Live previews on the web event stream with real processes: ``agentpost run web`` and ``agentpost run
processor`` running the real Claude CLI against the fake Anthropic API, which streams a reply over about five
seconds. A client of ``/api/events/stream`` sees the reply grow (``message:preview``, the whole text so far
each time) well before the one ``message:done``."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import httpx
import pytest

from tests.channel_support import Proc, run_cli
from tests.fakes.anthropic_api import Chunked, FakeAnthropic
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import claude_home, cli_env
from tests.web_support import SseReader, auth_headers, free_port, web_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LINES = [f"Line {i} of the answer, written slowly." for i in range(1, 11)]
REPLY = "\n".join(LINES)


def test_event_stream_shows_the_reply_growing_then_one_final(tmp_path: Path, api: FakeAnthropic) -> None:
    api.add_rule("tell me slowly", Chunked([line + "\n" for line in LINES], interval=0.5))
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}")
    env = cli_env(api, tmp_path)
    env["PATH"] = os.environ.get("PATH", env["PATH"])
    port = free_port()
    seen: list[tuple[float, str, dict[str, object]]] = []
    with web_process(home, port):
        processor = Proc("processor", home, env, tmp_path / "processor.log")
        reader = SseReader(port, "/api/events/stream")
        try:
            posted = httpx.post(
                f"http://127.0.0.1:{port}/api/message",
                json={"channel": "web", "sender": "ann", "message": "tell me slowly"},
                headers=auth_headers(port),
                timeout=10,
            )
            assert posted.status_code == 201, posted.text
            message_id = posted.json()["messageId"]
            deadline = time.monotonic() + 60
            for ev in reader.events(timeout=30):
                data = json.loads(ev["data"])
                mine = data.get("messageId") == message_id or message_id in (
                    (data.get("payload") or {}).get("message_ids") or []
                )
                if mine and ev.get("event") in ("message:preview", "message:done"):
                    seen.append((time.monotonic(), ev["event"], data["payload"]))
                if (mine and ev.get("event") == "message:done") or time.monotonic() > deadline:
                    break
        finally:
            reader.close()
            processor.stop()
    record = "\n".join(f"{at - seen[0][0]:6.2f}s {name}: {payload}" for at, name, payload in seen)
    previews = [(at, str(p["text"])) for at, name, p in seen if name == "message:preview"]
    done = [(at, p) for at, name, p in seen if name == "message:done"]
    assert len(done) == 1, record
    assert len(previews) >= 3, record
    texts = [t for _, t in previews]
    assert all(REPLY.startswith(t.strip()) for t in texts), record
    assert all(len(a) < len(b) for a, b in itertools.pairwise(texts)), record
    assert done[0][0] - previews[0][0] >= 2.0, record  # visible while it was written, not all at the end


def test_send_wait_prints_one_answer_not_the_preview_steps(tmp_path: Path, api: FakeAnthropic) -> None:
    """`agentpost send --wait` into a pipe while the reply streams: the previews (on the same event topic
    as the agent's steps) are not printed as steps; the answer is printed once."""
    api.add_rule("tell me slowly", Chunked([line + "\n" for line in LINES], interval=0.4))
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}")
    env = cli_env(api, tmp_path)
    env["PATH"] = os.environ.get("PATH", env["PATH"])
    processor = Proc("processor", home, env, tmp_path / "processor.log")
    try:
        done = run_cli(home, "send", "--wait", "tell me slowly")
    finally:
        processor.stop()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == REPLY, done.stdout
