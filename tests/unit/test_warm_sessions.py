"""Warm claude sessions, the parts without a process: what a turn records as the chat's session, how a cold
start resumes it, when a kept process may take a request, and what ``agentpost doctor`` says."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.settings.model import AgentSettings, load_settings
from workers.doctor import checks
from workers.providers.base import RunRequest
from workers.providers.claude import ClaudeProvider
from workers.providers.claude_warm import (
    available_memory,
    fingerprint,
    memory_cap,
    session_ref,
    split_session_ref,
)

pytestmark = pytest.mark.unit


def _request(tmp_path: Path, **change: object) -> RunRequest:
    cli = tmp_path / "claude"
    cli.write_text("#!/bin/sh\n")
    cli.chmod(0o755)
    values: dict[str, object] = {
        "agent": "coder",
        "settings": AgentSettings(provider="claude", command=[str(cli)]),
        "workspace": tmp_path / "ws",
        "prompt": "hi",
        "env": {"PATH": "/usr/bin", "AGENTPOST_MESSAGE_ID": "m1"},
        **change,
    }
    return RunRequest(**values)  # type: ignore[arg-type]


def test_a_warm_turn_records_where_to_resume_and_a_cold_start_resumes_there(tmp_path: Path) -> None:
    ref = session_ref("s-1", "u-9")
    assert ref == "s-1@u-9" and split_session_ref(ref) == ("s-1", "u-9")
    assert split_session_ref("s-1") == ("s-1", None) and session_ref("s-1", None) == "s-1"
    argv = ClaudeProvider().argv(_request(tmp_path, session_id=ref))
    at = argv.index("--resume")
    assert argv[at : at + 5] == ["--resume", "s-1", "--resume-session-at", "u-9", "--fork-session"]
    plain = ClaudeProvider().argv(_request(tmp_path, session_id="s-1"))
    assert "--resume-session-at" not in plain and "--fork-session" in plain


def test_a_kept_process_fits_the_next_message_unless_the_agent_changed(tmp_path: Path) -> None:
    provider = ClaudeProvider()
    first = _request(tmp_path)
    later = _request(tmp_path, session_id="s-1@u-9", env={"PATH": "/usr/bin", "AGENTPOST_MESSAGE_ID": "m2"})
    same = fingerprint(first, provider.argv(first))
    # Another message and a resume point are no reason to restart: the conversation is checked apart.
    assert fingerprint(later, provider.argv(later)) == same
    for changed in (
        _request(
            tmp_path, settings=AgentSettings(provider="claude", command=first.settings.command, model="m")
        ),
        _request(tmp_path, system_prompt="Be brief."),
        _request(tmp_path, env={"PATH": "/bin", "AGENTPOST_MESSAGE_ID": "m1"}),
        _request(tmp_path, workspace=tmp_path / "other"),
        _request(
            tmp_path,
            settings=AgentSettings(provider="claude", command=first.settings.command, timeout_seconds=5),
        ),
    ):
        assert fingerprint(changed, provider.argv(changed)) != same


def test_doctor_says_which_agents_keep_the_cold_path(tmp_path: Path) -> None:
    text = (
        '[queue]\ndefault_agent = "coder"\n\n[processor]\nsession_idle_seconds = 120\n\n[agents.coder]\nprovider = "claude"\n\n'
        '[agents.writer]\nprovider = "codex"\n\n[agents.tool]\nprovider = "command"\ncommand = ["true"]\n'
    )
    (tmp_path / "settings.toml").write_text(text)
    env = {"PATH": "/usr/bin", "ANTHROPIC_API_KEY": "k", "HOME": str(tmp_path)}
    found = {c.name: c for c in checks(load_settings(tmp_path, env))}
    warm = found["warm sessions"]
    assert warm.level == "ok" and "120 s" in warm.detail
    assert "tool (command), writer (codex) start their CLI for every message" in warm.detail
    (tmp_path / "settings.toml").write_text(
        text.replace("session_idle_seconds = 120", "session_idle_seconds = 0")
    )
    assert "warm sessions" not in {c.name for c in checks(load_settings(tmp_path, env))}


def test_warm_sessions_are_on_by_default_with_a_cap_from_memory(tmp_path: Path) -> None:
    (tmp_path / "settings.toml").write_text('[queue]\ndefault_agent = "coder"\n\n[agents.coder]\n')
    env = {"PATH": "/usr/bin", "ANTHROPIC_API_KEY": "k", "HOME": str(tmp_path)}
    settings = load_settings(tmp_path, env)
    assert settings.processor.session_idle_seconds == 300 and settings.processor.warm_sessions_total is None
    warm = {c.name: c for c in checks(settings)}["warm sessions"]
    available = available_memory()
    assert available is not None  # Linux: /proc/meminfo
    assert f"{memory_cap(0, available)} in all: a quarter of the" in warm.detail, warm.detail


def test_the_memory_cap_keeps_a_small_host_out_of_swap() -> None:
    mib = 2**20
    assert memory_cap(0, 500 * mib) == 0  # a quarter of 500 MiB holds no 210 MiB process: none is kept
    assert memory_cap(0, 1024 * mib) == 1
    assert memory_cap(0, 8 * 1024 * mib) == 9
    assert memory_cap(3, 500 * mib) == 3  # those kept already hold their memory: they stay
    assert memory_cap(0, 1024 * 1024 * mib) == 32  # the rule's own ceiling
    assert memory_cap(0, None) == 4  # no reading: a small fixed number
