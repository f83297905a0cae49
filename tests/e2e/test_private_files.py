"""Private files: a fresh ``agentpost init`` and the first database open under the usual umask 022 leave
nothing readable by other users; ``doctor`` names files that were loosened later."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def _run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTPOST_", "TELEGRAM_", "DISCORD_"))}
    env.update(AGENTPOST_HOME=str(home), NO_COLOR="1", HOME=str(home.parent))

    def umask_022() -> None:
        os.umask(0o022)

    return subprocess.run(
        [AGENTPOST, *args], env=env, capture_output=True, text=True, timeout=60, preexec_fn=umask_022
    )


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_and_first_use_create_private_files_and_doctor_flags_loose_ones(tmp_path: Path) -> None:
    home = tmp_path / "agentpost-home"
    assert _run(home, "init").returncode == 0
    sent = _run(home, "send", "hello there")
    assert sent.returncode == 0, sent.stderr
    db = home / "agentpost.db"
    assert _mode(home) == 0o700
    assert _mode(home / "settings.toml") == 0o600
    for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
        if path.exists():
            assert _mode(path) & 0o077 == 0, (path, oct(_mode(path)))
    assert db.exists() and _mode(db) == 0o600

    (home / "settings.toml").chmod(0o644)
    report = _run(home, "doctor", "--json")
    found = {(c["area"], c["name"]): c for c in json.loads(report.stdout)}
    modes = found[("security", "file modes")]
    assert modes["level"] == "warn" and "settings.toml (644)" in modes["detail"]
    assert "chmod" in modes["fix"]
