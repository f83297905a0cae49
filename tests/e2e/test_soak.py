"""Three minutes of chaos: ``bench/soak.py`` run as a person runs it, small.

The real processes (processor, the Telegram and Discord adapters against their fakes, scheduler, web) on a
SQLite home on a small tmpfs, the real Claude CLI against a fake API that answers some calls with 500s and
slow streams; every process kind SIGKILLed and restarted three times, the database locked for seconds once,
the disk filled once. Whatever the chaos did, every message got its final reply (or was told it could not
be answered) and none got two — counted from what the chats received, not from agentpost's tables.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import cli_installed  # noqa: F401  (fixture: the pinned Claude CLI is installed)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parents[2]
KINDS = ("processor", "telegram", "discord", "scheduler", "web")


def test_three_minutes_of_kills_a_locked_database_and_a_full_disk_lose_and_duplicate_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "soak.json"
    command = [
        sys.executable,
        str(REPO / "bench" / "soak.py"),
        *("--minutes", "1.5", "--chats", "24", "--agents", "4", "--rate", "0.4"),
        *("--kill-every", "30", "--lease", "8", "--drain", "150", "--burst-seconds", "4"),
        *("--db-down-seconds", "4", "--disk-full-seconds", "5", "--disk-size", "256m"),
        *("--json", str(out), "--workdir", str(tmp_path / "run"), "--keep"),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=460)
    assert out.exists(), f"no report (exit {done.returncode}):\n{done.stderr[-4000:]}"
    report = json.loads(out.read_text())
    shown = f"{done.stdout}\n{done.stderr[-3000:]}"
    # The chaos really happened: each kind killed and restarted, the database and the disk faults done.
    assert report["kills"] == dict.fromkeys(KINDS, 3), shown
    faults = {f["what"]: f["detail"] for f in report["faults"]}
    assert "held BEGIN EXCLUSIVE" in faults["database outage"], shown
    assert faults["disk full"].startswith(("disk full for", "skipped")), shown
    # Traffic flowed through it: most messages were answered with a real final reply.
    assert report["messages_sent"] >= 15, shown
    assert report["answered"] + report["told_could_not_answer"] == report["messages_sent"], shown
    # The point: nothing lost, nothing answered twice.
    assert report["lost"] == 0, (report["lost_messages"], shown)
    assert report["duplicate_finals"] == 0, (report["duplicate_final_messages"], shown)
    assert done.returncode == 0, shown
