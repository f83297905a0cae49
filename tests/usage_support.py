"""Helpers for the usage and budget tests: a ``claude`` command that runs the real Claude Code CLI and keeps a
copy of what it printed, so a test can sum the ``result`` lines the processor read (the CLI's own figures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.claude_env import claude_binary, claude_env


def claude_tee(tmp_path: Path) -> tuple[Path, Path]:
    """A claude command that keeps a copy of the CLI's stdout (what the processor parsed), and that copy."""
    log = tmp_path / "stream.jsonl"
    script = tmp_path / "claude-tee"
    script.write_text(f'#!/bin/sh\n"{claude_binary()}" "$@" | tee -a "{log}"\n')
    script.chmod(0o755)
    return script, log


def reported(log: Path) -> list[dict[str, Any]]:
    """The ``result`` lines the CLI printed, in order."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip().startswith("{")]
    return [line for line in lines if line.get("type") == "result"]


def own_cost(result: dict[str, Any]) -> float:
    """One run's own cost from its ``result`` line: ``total_cost_usd`` adds up the whole session, so a resumed
    run's share is its ``model_usage_since_last_result``."""
    return float(sum(m["costUSD"] for m in result["model_usage_since_last_result"].values()))


def cli_env(api: FakeAnthropic, tmp_path: Path) -> dict[str, str]:
    """The environment that points the real CLI at the fake API, with a home folder of its own."""
    home = tmp_path / "user-home"
    home.mkdir(exist_ok=True)
    return claude_env(api.base_url, home, max_retries=0)
