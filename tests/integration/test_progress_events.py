"""An agent's progress steps reach the event log batched: a step of a long run shows within about a second,
while a short run's steps are written with its completion (no transaction of their own)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.channel_support import wait_for
from tests.homes import open_home
from tests.processor_support import make_home, run_idle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

STEP_THEN_THINK = """
import sys, time
sys.stdin.read()
print("step one: reading the code", flush=True)
time.sleep(4)
print("done thinking", flush=True)
"""


def _types(rt: Runtime) -> list[str]:
    return [str(r["type"]) for r in rt.db.read("SELECT type FROM events ORDER BY id")]


def test_a_step_of_a_long_run_is_in_the_log_while_the_run_goes_on(tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(STEP_THEN_THINK, encoding="utf-8")
    home = make_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        {"alpha": {"provider": "command", "command": [sys.executable, str(script)]}},
    )
    rt = open_home(home)
    try:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), "please look")
        worker = threading.Thread(target=run_idle, args=(rt,), daemon=True)
        worker.start()
        wait_for(lambda: "chain_step_start" in _types(rt), 15, "the run to start")
        wait_for(lambda: "agent_progress" in _types(rt), 3, "the step's event during the run")
        assert "chain_step_done" not in _types(rt)  # the run is still going
        worker.join(30)
        assert not worker.is_alive()
        types = _types(rt)
        assert types.index("agent_progress") < types.index("chain_step_done") < types.index("response_ready")
        assert types.count("agent_progress") == 2
    finally:
        rt.close()
