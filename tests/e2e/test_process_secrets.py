"""Each process started by `agentpost up` holds only the secrets it uses. supervisord hands its children the
environment of the shell that first ran `up` — every token and key in it — so before, the processor held the
Telegram token and the Telegram adapter held the Anthropic key. Read from ``/proc/<pid>/environ`` of the real
processes (root may read them; the processes are non-dumpable for anyone else)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import supervise
from tests.fakes.telegram_api import FakeTelegram
from tests.probes import free_port
from tests.scheduler_support import cli_env, run_cli, up_home

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

UP_TIMEOUT = 300
PROVIDER_KEY = "sk-ant-test-provider-key"
AWS_SECRET = "aws-secret-for-bedrock"
API_TOKEN = "web-api-token-value"


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield from up_home(tmp_path, UP_TIMEOUT)


def _environ(pid: object) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_each_process_under_up_holds_only_its_own_secrets(home: Path) -> None:
    with FakeTelegram() as fake:
        env = cli_env(
            home,
            {
                "PTB_TIMEDELTA": "1",
                "AGENTPOST_API_PORT": str(free_port()),
                "TELEGRAM_BOT_TOKEN": fake.token,
                "TELEGRAM_API_BASE_URL": fake.url,
                "ANTHROPIC_API_KEY": PROVIDER_KEY,
                "AWS_SECRET_ACCESS_KEY": AWS_SECRET,
                "WHATSAPP_APP_SECRET": "secret-of-a-channel-not-started",
                "AGENTPOST_API_TOKEN": API_TOKEN,
            },
        )
        out = run_cli(home, "up", env=env, check=False, timeout=UP_TIMEOUT)
        assert out.returncode == 0, out.stdout + out.stderr
        p = supervise.paths(home)
        states = {s["name"]: s for s in supervise.process_info(p)}
        assert {"processor", "web", "scheduler", "telegram"} <= set(states), states
        seen = {name: _environ(s["pid"]) for name, s in states.items()}
        run_cli(home, "down", env=env, timeout=UP_TIMEOUT)

    # The channel has its token; no one else does.
    assert seen["telegram"]["TELEGRAM_BOT_TOKEN"] == fake.token
    for name in ("processor", "web", "scheduler"):
        assert "TELEGRAM_BOT_TOKEN" not in seen[name], name
    # The processor has the provider's keys (its agents need them); the channel, web and scheduler do not.
    assert seen["processor"]["ANTHROPIC_API_KEY"] == PROVIDER_KEY
    assert seen["processor"]["AWS_SECRET_ACCESS_KEY"] == AWS_SECRET
    for name in ("telegram", "web", "scheduler"):
        assert "ANTHROPIC_API_KEY" not in seen[name] and "AWS_SECRET_ACCESS_KEY" not in seen[name], name
    # The API token is the web process's alone: an agent run by the processor could otherwise use it to
    # drive the management API (issue 37). `up` prints the dashboard's sign-in link with it.
    assert seen["web"]["AGENTPOST_API_TOKEN"] == API_TOKEN
    for name in ("processor", "scheduler", "telegram"):
        assert "AGENTPOST_API_TOKEN" not in seen[name], name
    assert f"/signin#{API_TOKEN}" in out.stdout
    # A token of a channel that is not running reaches nobody.
    assert "whatsapp" not in seen and all("WHATSAPP_APP_SECRET" not in e for e in seen.values())
    # Every process still has what every process reads.
    assert all(e["AGENTPOST_HOME"] == str(home) for e in seen.values())
