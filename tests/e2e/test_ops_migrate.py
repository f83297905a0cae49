"""`agentpost migrate --to postgresql://...` from the command line, then the scheduler process running on
the new URL; a second migration onto the (now non-empty) target is refused."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import open_runtime
from tests.scheduler_support import (
    fresh_pg_database,
    make_dead,
    run_cli,
    start_process,
    stop_process,
    wait_until,
    write_home,
)

pytestmark = [pytest.mark.e2e, pytest.mark.postgres]


def test_migrate_cli_then_run_on_postgresql(tmp_path: Path) -> None:
    extra = (
        "[heartbeats.assistant]\ninterval = 1\nskip_when_busy = false\n\n[scheduler]\ncatchup_seconds = 0\n"
    )
    home = write_home(tmp_path / "home", f"sqlite:///{tmp_path / 'agentpost.db'}", extra)
    with open_runtime(home, env={}) as rt:
        make_dead(rt.queue, 2)
        for i in range(3):
            rt.queue.intake.enqueue_message(ChatAddress("cli", "ann"), f"waiting {i}")
    before = json.loads(run_cli(home, "queue", "status", "--json").stdout)
    with fresh_pg_database() as pg:
        out = run_cli(home, "migrate", "--to", pg)
        assert "verified: every count matches" in out.stdout and "switched database.url" in out.stdout
        assert tomllib.loads((home / "settings.toml").read_text())["database"]["url"] == pg
        assert json.loads(run_cli(home, "queue", "status", "--json").stdout) == before
        proc = start_process(home, "scheduler", tmp_path / "scheduler.log")
        try:
            with open_runtime(home, env={}) as rt:
                assert rt.db.dialect.name == "postgresql"
                wait_until(
                    lambda: rt.db.read_scalar("SELECT COUNT(*) FROM messages WHERE channel = 'heartbeat'"),
                    30,
                    what="a heartbeat written to PostgreSQL",
                )
        finally:
            assert stop_process(proc) == 0
        other = write_home(tmp_path / "other", f"sqlite:///{tmp_path / 'agentpost.db'}")
        refused = run_cli(other, "migrate", "--to", pg, check=False)
        assert refused.returncode == 1 and "not empty" in refused.stderr
        assert "postgresql" not in (other / "settings.toml").read_text()
