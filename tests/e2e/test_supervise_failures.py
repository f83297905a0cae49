"""What `agentpost up`, `agentpost run web` and `make run` say when something is in the way, with real
processes: a real program listening on the web port, a real supervisord, the real Telegram adapter against
the fake Bot API. `up` must wait until each process is really up, name the cause of one that is not (and
exit non-zero), and give a process the variables of the shell that ran the latest `up`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import supervise
from shared import port_owner
from tests.fakes.telegram_api import FakeTelegram
from tests.probes import free_port
from tests.scheduler_support import cli_env, run_cli, up_home, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
#: `up` waits for every process; on a loaded two-core machine a start takes seconds each.
UP_TIMEOUT = 300


def _flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


def _states(home: Path) -> dict[str, dict[str, object]]:
    p = supervise.paths(home)
    if not supervise.is_running(p):
        return {}
    return {s["name"]: s for s in supervise.process_info(p)}


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    yield from up_home(tmp_path, UP_TIMEOUT)


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """Another program holding a port: a real process (``holder.py``) listening on 127.0.0.1."""
    port = free_port()
    script = tmp_path / "holder.py"
    script.write_text(
        "import socket, sys, time\n"
        "s = socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('127.0.0.1', int(sys.argv[1])))\n"
        "s.listen()\n"
        "print('listening', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script), str(port)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "listening"
    yield proc, port
    proc.kill()
    proc.wait(10)
    proc.stdout.close()


def test_run_web_with_its_port_taken_says_who_holds_it_before_announcing_anything(
    home: Path, listener: tuple[subprocess.Popen[str], int]
) -> None:
    holder, port = listener
    out = run_cli(home, "run", "web", env=cli_env(home, {"AGENTPOST_API_PORT": str(port)}), check=False)
    said = out.stdout + out.stderr
    assert out.returncode != 0
    assert "Errno 98" not in said and "address already in use" not in said.lower()
    assert f"on http://127.0.0.1:{port}" not in said, "the address was announced for a port it cannot serve"
    line = _flat(out.stderr)
    assert f"port {port} is in use by pid {holder.pid} (" in line and "holder.py" in line
    assert "AGENTPOST_API_PORT" in line
    assert holder.poll() is None  # the other program is untouched


def test_up_with_the_web_port_taken_names_the_holder_exits_non_zero_and_stops_web(
    home: Path, listener: tuple[subprocess.Popen[str], int]
) -> None:
    holder, port = listener
    env = cli_env(home, {"AGENTPOST_API_PORT": str(port)})
    out = run_cli(home, "up", env=env, check=False, timeout=UP_TIMEOUT)
    assert out.returncode == 1, out.stdout + out.stderr
    err = _flat(out.stderr)
    assert f"web: port {port} is in use by pid {holder.pid} (" in err and "holder.py" in err
    assert "AGENTPOST_API_PORT" in err
    assert "dashboard: http" not in out.stdout, "the address would serve the other program"
    states = _states(home)
    assert states["web"]["statename"] == "STOPPED", "web is left restart-looping"
    assert {states[n]["statename"] for n in ("processor", "scheduler")} == {"RUNNING"}

    # Once the port is free, `up` again starts web and it is web that answers there.
    holder.kill()
    holder.wait(10)
    again = run_cli(home, "up", env=env, check=False, timeout=UP_TIMEOUT)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"dashboard: http://127.0.0.1:{port}/" in _flat(again.stdout)
    web = _states(home)["web"]
    assert web["statename"] == "RUNNING"
    assert [h.pid for h in port_owner.listeners(port)] == [web["pid"]]


def test_a_later_up_passes_a_new_channel_token_and_a_changed_port_to_the_processes(home: Path) -> None:
    first_port, second_port = free_port(), free_port()
    base = cli_env(home, {"PTB_TIMEDELTA": "1", "AGENTPOST_API_PORT": str(first_port)})
    first = run_cli(home, "up", env=base, timeout=UP_TIMEOUT)
    assert "TELEGRAM_BOT_TOKEN" in _flat(first.stdout)
    before = _states(home)
    assert "telegram" not in before

    with FakeTelegram() as fake:
        env = {**base, "TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}
        out = run_cli(home, "up", env=env, check=False, timeout=UP_TIMEOUT)
        assert out.returncode == 0, out.stdout + out.stderr
        states = _states(home)
        assert states["telegram"]["statename"] == "RUNNING"
        environ = Path(f"/proc/{states['telegram']['pid']}/environ").read_bytes().split(b"\0")
        assert f"TELEGRAM_BOT_TOKEN={fake.token}".encode() in environ
        # It really works with the token the shell has now: it polls the Bot API with it.
        wait_until(
            lambda: any(c.method == "getUpdates" and c.error is None for c in fake.calls),
            60,
            what="the telegram adapter polling the fake Bot API with its token",
        )
        # A channel's variables concern that channel only: nothing else was restarted.
        assert {n: states[n]["pid"] for n in before} == {n: s["pid"] for n, s in before.items()}

        # A changed port reaches web (restarted, and said so); the old port is free.
        env["AGENTPOST_API_PORT"] = str(second_port)
        moved = run_cli(home, "up", env=env, check=False, timeout=UP_TIMEOUT)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        text = _flat(moved.stdout)
        assert f"dashboard: http://127.0.0.1:{second_port}/" in text
        assert "web: restarted to take the changed AGENTPOST_API_PORT" in text
        web = _states(home)["web"]
        assert [h.pid for h in port_owner.listeners(second_port)] == [web["pid"]]
        assert port_owner.listeners(first_port) == []
        run_cli(home, "down", env=env, timeout=UP_TIMEOUT)


def test_make_run_names_the_next_steps_and_silences_npm_s_update_notice(home: Path) -> None:
    port = free_port()
    env = cli_env(home, {"AGENTPOST_API_PORT": str(port)})
    # -o: take the installed environment as it is (a test must not reinstall the shared checkout).
    stamps = ["-o", ".venv/.installed-stamp", "-o", "node_modules/.installed-stamp"]
    out = subprocess.run(
        ["make", "-s", *stamps, "run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=UP_TIMEOUT
    )
    assert out.returncode == 0, out.stdout + out.stderr
    tail = out.stdout.split(f"dashboard: http://127.0.0.1:{port}/", 1)[1]
    assert "the agentpost command is .venv/bin/agentpost" in tail
    for step in ("agentpost init", "agentpost doctor", "agentpost send -w", "agentpost down"):
        assert f".venv/bin/{step}" in tail, step
    # npm's update check cannot be shown offline; the install recipe must switch it off.
    recipe = subprocess.run(
        ["make", "-n", "-B", "node_modules/.installed-stamp"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    npm = next(line for line in recipe.splitlines() if "npm ci" in line)
    assert "--no-update-notifier" in npm and "NO_UPDATE_NOTIFIER=1" in npm
