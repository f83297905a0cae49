"""What the operator's CLI prints, as a person runs it: list commands fit 80 columns without cutting an
id, trace shows a whole error, doctor explains root + bypassPermissions, and `send` stays light (no
SQLAlchemy, psycopg, plugins or Markdown renderer loaded for it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import open_runtime
from shared.storage import schema

pytestmark = pytest.mark.e2e

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))
LONG_AGENT = "a-rather-long-agent-name-32chars"  # the longest name allowed: 32 characters
ROOT_ERROR = (
    "claude exited 1: --dangerously-skip-permissions cannot be used with root/sudo privileges for "
    "security reasons (the end of this error must show too: END-OF-ERROR)"
)


def run(home: Path, *args: str, columns: int = 80, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_") and k != "IS_SANDBOX"}
    base.update(AGENTPOST_HOME=str(home), HOME=str(home), NO_COLOR="1", COLUMNS=str(columns), **env)
    return subprocess.run([AGENTPOST, *args], env=base, capture_output=True, text=True, timeout=60)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text(
        f'[queue]\ndefault_agent = "{LONG_AGENT}"\n[agents.{LONG_AGENT}]\nprovider = "claude"\n'
        '[agents.root-bypass]\nprovider = "claude"\npermission_mode = "bypassPermissions"\n'
    )
    assert len(LONG_AGENT) == 32
    return home


def _dead_letter(home: Path, text: str, message_id: str) -> str:
    with open_runtime(home, env={}) as rt:
        queued = rt.queue.intake.enqueue_message(ChatAddress("telegram", "ann"), text, message_id=message_id)
        claimed = rt.queue.messages.claim_all_pending_messages(LONG_AGENT, "w1", lease_ms=60_000)
        assert [m.message_id for m in claimed] == [queued.message_id]
        rt.queue.failures.fail_messages([queued.message_id], "w1", ROOT_ERROR, permanent=True)
        return queued.message_id


def test_list_commands_fit_80_columns_and_keep_whole_ids(home: Path) -> None:
    ids = [
        _dead_letter(home, "please look at the flaky test in the payments module " * 3, "telegram_v8712lq0"),
        _dead_letter(home, "short", "whatsapp_abcdefgh"),
    ]
    out = run(home, "dead", "list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), out.stdout
    for message_id in ids:
        assert any(message_id in line and LONG_AGENT in line for line in lines), out.stdout
    assert "cannot be used" in out.stdout  # the error is shown (shortened with … at 80 columns)

    wide = run(home, "dead", "list", columns=200)
    assert all(len(line) <= 200 for line in wide.stdout.splitlines())
    assert sum(ids[0] in line and "last error" not in line for line in wide.stdout.splitlines()) == 1

    with open_runtime(home, env={}) as rt:
        rt.queue.intake.enqueue_message(ChatAddress("api", "bob"), "waiting")
    agents = run(home, "queue", "agents")
    assert agents.returncode == 0, agents.stderr
    assert all(len(line) <= 80 for line in agents.stdout.splitlines())
    assert any(line.split()[:2] == [LONG_AGENT, "1"] for line in agents.stdout.splitlines()), agents.stdout
    status = run(home, "queue", "status")
    assert any(line.split() == ["dead", "2"] for line in status.stdout.splitlines()), status.stdout
    assert all(len(line) <= 80 for line in status.stdout.splitlines())


def test_trace_shows_the_whole_error(home: Path) -> None:
    message_id = _dead_letter(home, "run the tests", "telegram_tr4ce000")
    out = run(home, "trace", message_id)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert f"error={ROOT_ERROR}" in text, out.stdout
    assert "END-OF-ERROR)" in text
    data = json.loads(run(home, "trace", message_id, "--json").stdout)
    assert data["message"]["last_error"] == ROOT_ERROR


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_doctor_explains_root_and_bypass_permissions(home: Path) -> None:
    found = {(c["area"], c["name"]): c for c in json.loads(run(home, "doctor", "--json").stdout)}
    check = found[("security", "agent root-bypass")]
    assert check["level"] == "warn"
    assert "agentpost sets IS_SANDBOX=1" in check["detail"] and "root" in check["detail"]
    assert "non-root service user" in check["fix"] and "User=agentpost" in check["fix"]

    refused = {
        (c["area"], c["name"]): c for c in json.loads(run(home, "doctor", "--json", IS_SANDBOX="0").stdout)
    }
    check = refused[("security", "agent root-bypass")]
    assert check["level"] == "warn"  # the processor gives the CLI IS_SANDBOX=1 whatever was set
    assert "replacing IS_SANDBOX=0, which the CLI refuses" in check["detail"]


def test_send_loads_no_database_toolkit_plugins_or_renderer(home: Path) -> None:
    assert run(home, "init", "--force").returncode == 0  # the schema exists: send only checks its version
    probe = (
        "import sys\n"
        "sys.argv = ['agentpost', 'send', 'hello']\n"
        "from shared.cli.main import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ['sqlalchemy', 'sqlmodel', 'psycopg', 'rich.markdown', 'workers', 'scheduler', 'adapters']\n"
        "print('LOADED', [m for m in heavy if m in sys.modules])\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), HOME=str(home))
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "LOADED []", out.stdout
    assert out.stdout.splitlines()[0].startswith("cli_")  # the message id was printed


def test_the_quick_schema_check_knows_the_models_version(tmp_path: Path) -> None:
    from shared.storage import db, models

    assert db.SCHEMA_VERSION == models.SCHEMA_VERSION
    quick = schema.open_database(f"sqlite:///{tmp_path / 'a.db'}", quick=True)  # a new file: full creation
    try:
        assert "messages" in schema.table_names(quick)
        assert schema.create_schema(quick, quick=True) == models.SCHEMA_VERSION
    finally:
        quick.close()
