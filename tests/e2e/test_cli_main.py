"""The `agentpost` command as a user runs it: init, send, queue status/agents, dead list/retry/delete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.queue.core import Queue
from shared.settings.model import load_settings
from shared.storage.schema import open_database

pytestmark = pytest.mark.e2e

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def run(home: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), COLUMNS="200", NO_COLOR="1")
    proc = subprocess.run([AGENTPOST, *args], env=env, capture_output=True, text=True, timeout=60)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_init_send_and_inspect(tmp_path: Path) -> None:
    home = tmp_path / "home"
    out = run(home, "init")
    assert "settings.toml" in out.stdout and (home / "settings.toml").exists()
    again = run(home, "init", ok=False)
    assert again.returncode != 0 and "already exists" in again.stderr
    mid = run(home, "send", "hello agent").stdout.strip()
    assert mid.startswith("cli_") and len(mid) == 12
    assert run(home, "send", "--channel", "web", "--sender", "ann", "second").stdout.startswith("web_")
    status = json.loads(run(home, "queue", "status", "--json").stdout)
    assert status["pending"] == 2 and status["dead"] == 0
    agents = json.loads(run(home, "queue", "agents", "--json").stdout)
    assert agents == [{"agent": "assistant", "pending": 2, "processing": 0}]
    table = run(home, "queue", "status").stdout
    assert "pending" in table and "2" in table


def test_bad_input_is_a_clear_error_and_changes_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run(home, "init")
    cases = [
        (["send", ""], "message is empty"),
        (["send", "x", "--agent", "Bad Name"], "must match"),
        (["send", "x", "--agent", "ghost"], "unknown agent"),
        (["send", "x", "--id", "nope"], "must look like"),
        (["dead", "retry", "12345"], "no dead letter"),
        (["dead", "delete", "cli_zzzzzzzz"], "no dead letter"),
        (["run", "nonsense"], "unknown process kind"),
    ]
    for args, message in cases:
        proc = run(home, *args, ok=False)
        assert proc.returncode != 0, args
        assert message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    first = run(home, "send", "--id", "cli_abcdefgh", "once").stdout.strip()
    dup = run(home, "send", "--id", "cli_abcdefgh", "twice", ok=False)
    assert first == "cli_abcdefgh" and dup.returncode != 0 and "already queued" in dup.stderr
    status = json.loads(run(home, "queue", "status", "--json").stdout)
    assert status["pending"] == 1


def test_bad_settings_stop_every_command_with_the_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text("[queue]\nmax_retries = -1\n")
    proc = run(home, "queue", "status", ok=False)
    assert proc.returncode == 2 and "queue.max_retries" in proc.stderr and "settings.toml" in proc.stderr


def test_dead_letters_list_retry_and_delete(tmp_path: Path) -> None:
    home = tmp_path / "home"
    run(home, "init")
    settings = load_settings(home, env={})
    db = open_database(settings.database_url)
    queue = Queue.from_settings(settings, db)
    ids = [queue.intake.enqueue_message(ChatAddress("cli", "s"), f"m{i}").message_id for i in range(2)]
    for _ in range(settings.queue.max_retries):
        with db.transaction() as tx:
            tx.execute("UPDATE messages SET available_at = 0 WHERE status = 'pending'")
        queue.messages.claim_all_pending_messages("assistant", "w")
        queue.failures.fail_messages(ids, "w", "exit 1: boom")
    listed = json.loads(run(home, "dead", "list", "--json").stdout)
    assert sorted(d["message_id"] for d in listed) == sorted(ids)
    assert all(d["last_error"] == "exit 1: boom" and d["retry_count"] == 5 for d in listed)
    assert ids[0] in run(home, "dead", "list").stdout
    assert "pending again" in run(home, "dead", "retry", ids[0]).stdout
    assert "deleted" in run(home, "dead", "delete", str(queue.admin.list_dead()[0].id)).stdout
    assert json.loads(run(home, "dead", "list", "--json").stdout) == []
    m = queue.admin.get_message(ids[0])
    assert m is not None and m.status == "pending" and m.manual_retries == 1
    assert queue.admin.get_message(ids[1]) is None
    db.close()


def test_help_explains_commands(tmp_path: Path) -> None:
    out = run(tmp_path, "--help").stdout
    for word in ("init", "send", "queue", "dead", "run"):
        assert word in out
    assert "Queue a message" in run(tmp_path, "send", "--help").stdout


def test_running_one_process_loads_only_its_own_code(tmp_path: Path) -> None:
    # A restart is on the clock (a successor re-runs a killed processor's message within 3 s): `agentpost run
    # processor` must not import the web server and every channel library first. Bad settings stop the
    # processor right after its own code loaded, and the interpreter then lists what was imported.
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text("[queue]\nmax_retries = -1\n")
    probe = (
        "import sys\n"
        "from shared.cli.main import main\n"
        "sys.argv = ['agentpost', 'run', 'processor']\n"
        "try:\n    main()\nexcept SystemExit as done:\n    print('exit', done.code)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('adapters', 'workers', 'scheduler'))))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        env={**os.environ, "AGENTPOST_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = proc.stdout.splitlines()
    assert lines[0] == "exit 2" and "max_retries" in proc.stderr, (proc.stdout, proc.stderr)
    loaded = set(lines[1].split())
    assert "workers.processor" in loaded
    assert not loaded & {"adapters.web.server", "adapters.discord", "adapters.telegram", "adapters.whatsapp"}
    assert "scheduler.service" not in loaded
