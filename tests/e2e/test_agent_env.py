"""What an agent can see of the machine's secrets: the real processor process runs a command agent that prints
its whole environment, while the processor itself holds every secret agentpost knows of."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from tests.fakes.anthropic_api import (
    JSON,
    Computed,
    FakeAnthropic,
    Reply,
    ToolUse,
    tool_result_text,
    tool_results,
)
from tests.fakes.claude_env import claude_binary, claude_env
from tests.homes import open_home
from tests.probes import wait_for
from tests.processor_support import make_home

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))

PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def test_an_agent_sees_no_secret_of_the_processor_but_its_own_variables(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'agentpost.db'}"
    home = make_home(
        tmp_path,
        db_url,
        {
            "printer": {
                "provider": "command",
                "command": [sys.executable, "-c", PRINT_ENV],
                "env": {"PRINTER_SETTING": "from-the-agent-table"},
            }
        },
    )
    secrets = {
        "TELEGRAM_BOT_TOKEN": "123:telegram-secret",
        "DISCORD_BOT_TOKEN": "discord-secret",
        "WHATSAPP_APP_SECRET": "whatsapp-secret",
        "WHATSAPP_ACCESS_TOKEN": "whatsapp-token",
        "AGENTPOST_API_TOKEN": "api-secret",
        "AGENTPOST_DATABASE_URL": db_url,
        "AGENTPOST_REDIS_URL": "redis://127.0.0.1:6379/9",
        "SOME_OTHER_PASSWORD": "hunter2",
    }
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "AGENTPOST_HOME": str(home),
        **secrets,
    }
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "print your environment")
        out = (tmp_path / "processor.out").open("wb")
        proc = subprocess.Popen(
            [AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            reply = wait_for(
                lambda: rt.db.read_scalar(
                    "SELECT message FROM responses WHERE message_id = :m", {"m": sent.message_id}
                ),
                30,
                "the agent's reply",
            )
        finally:
            proc.kill()
            proc.wait(timeout=10)
            out.close()
    seen = json.loads(str(reply))
    for name, value in secrets.items():
        assert name not in seen, name
        assert all(value not in v for v in seen.values()), f"the value of {name} leaked"
    assert seen["PRINTER_SETTING"] == "from-the-agent-table"
    assert seen["PATH"] == env["PATH"] and seen["LANG"] == "C.UTF-8"
    assert seen["AGENTPOST_AGENT"] == "printer" and seen["AGENTPOST_MESSAGE_ID"] == sent.message_id


def _env_printer(body: JSON) -> str | Reply:
    """The scripted model: run ``env`` in the Bash tool, then answer with what the tool printed."""
    results = tool_results(body)
    if not results:
        return ToolUse("Bash", {"command": "env", "description": "Print the environment"})
    return tool_result_text(results[0])


def test_a_claude_agent_sees_only_the_clis_own_variables_and_runs_as_root_with_a_sandbox_value(
    tmp_path: Path,
) -> None:
    """The real processor runs the real claude CLI (bypassPermissions), whose Bash tool prints what the agent
    can see, while the processor holds host secrets under AWS_* and BASH_* and an IS_SANDBOX=yes."""
    claude_binary()  # the pinned CLI is installed (or this says how to install it)
    db_url = f"sqlite:///{tmp_path / 'agentpost.db'}"
    home = make_home(
        tmp_path,
        db_url,
        {"coder": {"provider": "claude", "permission_mode": "bypassPermissions", "timeout_seconds": 90}},
    )
    secrets = {
        "AWS_SECRET_ACCESS_KEY": "aws-host-secret",
        "AWS_ACCESS_KEY_ID": "AKIAHOSTKEY",
        "AWS_SESSION_TOKEN": "aws-session-secret",
        "BASH_ENV_SECRET": "bash-prefixed-secret",
        "TELEGRAM_BOT_TOKEN": "123:telegram-secret",
    }
    with FakeAnthropic(default=Computed(_env_printer)) as api:
        base_url = api.base_url
        user_home = tmp_path / "user-home"
        user_home.mkdir()
        env = {
            **claude_env(api.base_url, user_home, max_retries=0),
            "AGENTPOST_HOME": str(home),
            "IS_SANDBOX": "yes",  # kept as it was, the CLI refused bypassPermissions as root
            "BASH_DEFAULT_TIMEOUT_MS": "123456",  # documented for the CLI: passes
            **secrets,
        }
        with open_home(home) as rt:
            sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "print your environment")
            out = (tmp_path / "processor.out").open("wb")
            proc = subprocess.Popen(
                [AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
            try:
                reply = wait_for(
                    lambda: rt.db.read_scalar(
                        "SELECT message FROM responses WHERE message_id = :m", {"m": sent.message_id}
                    ),
                    90,
                    "the agent's reply",
                )
            finally:
                proc.kill()
                proc.wait(timeout=10)
                out.close()
    seen = dict(line.split("=", 1) for line in str(reply).splitlines() if "=" in line)
    assert "BASH_DEFAULT_TIMEOUT_MS" in seen, reply  # the reply is the Bash tool's `env`, not an error
    for name, value in secrets.items():
        assert name not in seen, name
        assert all(value not in v for v in seen.values()), f"the value of {name} leaked"
    assert seen["BASH_DEFAULT_TIMEOUT_MS"] == "123456" and seen["ANTHROPIC_BASE_URL"] == base_url
    if os.geteuid() == 0:
        assert seen["IS_SANDBOX"] == "1"
