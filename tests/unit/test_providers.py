"""Provider arguments and environment: how a chat's upload folder is made readable to the claude CLI, which of
the processor's variables an agent's CLI receives, and the IS_SANDBOX value a root run with bypassed
permissions needs (and ``agentpost doctor`` says so)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.cli.doctor import check_security
from shared.settings.model import AgentSettings, load_settings
from workers.agent_env import child_env
from workers.doctor import checks
from workers.providers.claude import read_access

pytestmark = pytest.mark.unit

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def test_read_access_arguments() -> None:
    assert read_access(Path("/srv/agentpost/files/telegram/42")) == [
        "--allowedTools",
        "Read(//srv/agentpost/files/telegram/42/**)",
    ]
    # A path the permission-rule syntax cannot carry falls back to --add-dir.
    assert read_access(Path("/srv/my home/files/telegram/42")) == [
        "--add-dir",
        "/srv/my home/files/telegram/42",
    ]
    assert read_access(Path("/srv/a,b(c)/x")) == ["--add-dir", "/srv/a,b(c)/x"]


HOST = {
    "PATH": "/usr/bin",
    "AWS_SECRET_ACCESS_KEY": "host-secret",
    "AWS_ACCESS_KEY_ID": "AKIAHOST",
    "AWS_REGION": "eu-west-1",
    "AWS_SOME_TOOL_TOKEN": "tool-secret",
    "BASH_ENV": "/etc/evil-profile",
    "BASH_ENV_SECRET": "shell-secret",
    "BASH_DEFAULT_TIMEOUT_MS": "300000",
    "BASH_MAX_OUTPUT_LENGTH": "50000",
    "ANTHROPIC_API_KEY": "sk-ant-test",
    "CLAUDE_CODE_MAX_RETRIES": "3",
    "CLAUDE_SOMETHING_ELSE": "not the CLI's",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_MY_FIREWALL": "1",
    "MCP_SERVER_PASSWORD": "mcp-secret",
    "MCP_TIMEOUT": "10000",
    "VERTEX_REGION_CLAUDE_3_5_HAIKU": "us-east5",
    "TELEGRAM_BOT_TOKEN": "123:t",
}


def test_a_claude_agent_gets_the_variables_its_cli_documents_and_no_other() -> None:
    env = child_env(HOST, AgentSettings(provider="claude"))
    assert sorted(env) == [
        "ANTHROPIC_API_KEY", "BASH_DEFAULT_TIMEOUT_MS", "BASH_MAX_OUTPUT_LENGTH", "CLAUDE_CODE_MAX_RETRIES",
        "DISABLE_TELEMETRY", "MCP_TIMEOUT", "PATH", "VERTEX_REGION_CLAUDE_3_5_HAIKU",
    ]  # fmt: skip


@pytest.mark.parametrize("where", ["processor", "agent table"])
def test_aws_credentials_reach_a_claude_agent_only_while_it_is_switched_to_bedrock(where: str) -> None:
    switch = {"CLAUDE_CODE_USE_BEDROCK": "1"}
    host = {**HOST, **switch} if where == "processor" else HOST
    agent = AgentSettings(provider="claude", env=switch if where == "agent table" else {})
    env = child_env(host, agent)
    assert {k: env[k] for k in env if k.startswith("AWS_")} == {
        "AWS_SECRET_ACCESS_KEY": "host-secret",
        "AWS_ACCESS_KEY_ID": "AKIAHOST",
        "AWS_REGION": "eu-west-1",
    }  # the CLI's credential chain; an unrelated AWS_* stays behind
    off = child_env({**HOST, "CLAUDE_CODE_USE_BEDROCK": "0"}, AgentSettings(provider="claude"))
    assert not [k for k in off if k.startswith("AWS_")]


def test_anything_else_reaches_an_agent_only_through_its_env_table() -> None:
    agent = AgentSettings(provider="claude", env={"AWS_PROFILE": "build", "BASH_ENV_SECRET": "given"})
    env = child_env(HOST, agent)
    assert env["AWS_PROFILE"] == "build" and env["BASH_ENV_SECRET"] == "given"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "BASH_ENV" not in env


@pytest.mark.skipif(not ROOT, reason="the CLI's refusal and agentpost's override apply to root only")
@pytest.mark.parametrize("given", [None, "yes", "true", "0"])
def test_as_root_with_bypassed_permissions_is_sandbox_is_the_one_value_the_cli_accepts(
    given: str | None,
) -> None:
    host = {"PATH": "/usr/bin", **({"IS_SANDBOX": given} if given is not None else {})}
    bypass = AgentSettings(provider="claude", permission_mode="bypassPermissions")
    assert child_env(host, bypass)["IS_SANDBOX"] == "1"
    in_table = AgentSettings(
        provider="claude", permission_mode="bypassPermissions", env={"IS_SANDBOX": given or "yes"}
    )
    assert child_env({"PATH": "/usr/bin"}, in_table)["IS_SANDBOX"] == "1"
    careful = child_env(host, AgentSettings(provider="claude", permission_mode="acceptEdits"))
    assert careful.get("IS_SANDBOX") == given  # untouched where the CLI does not need it


@pytest.mark.skipif(not ROOT, reason="the check is about running as root")
def test_doctor_says_that_is_sandbox_is_set_and_what_it_replaces(tmp_path: Path) -> None:
    cli = tmp_path / "claude"
    cli.write_text("#!/bin/sh\n")
    cli.chmod(0o755)
    text = (
        '[queue]\ndefault_agent = "coder"\n'
        f'[agents.coder]\nprovider = "claude"\npermission_mode = "bypassPermissions"\ncommand = ["{cli}"]\n'
        f'[agents.careful]\nprovider = "claude"\ncommand = ["{cli}"]\n'
    )
    env = {"PATH": "/usr/bin", "IS_SANDBOX": "yes", "ANTHROPIC_API_KEY": "k", "HOME": str(tmp_path)}
    (tmp_path / "settings.toml").write_text(text)
    settings = load_settings(tmp_path, env)
    security = {c.name: c for c in check_security(settings)}
    sandbox = security["agent coder"]
    assert sandbox.level == "warn"
    assert "agentpost sets IS_SANDBOX=1 for its CLI, replacing IS_SANDBOX=yes, which the CLI refuses" in (
        sandbox.detail
    )
    assert "agent careful" not in security
    agents = {c.name: c for c in checks(settings)}
    assert "IS_SANDBOX" in agents["agent coder environment"].detail  # among what it receives
