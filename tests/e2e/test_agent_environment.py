"""What an agent can see of the machine's secrets: the real processor process runs a command agent that prints
its whole environment, while the processor itself holds every secret agentpost knows of."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processor_support import make_home, open_home, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

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
        sent = rt.queue.enqueue_message("cli", "me", "print your environment")
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
