"""`agentpost up | status | down` under a real supervisord, a SIGKILLed process restarted with no message
lost, and the deployment files (systemd units, supervisord.conf) checked field by field."""

from __future__ import annotations

import configparser
import importlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scheduler import supervise
from shared.chat.address import ChatAddress
from shared.runtime import open_runtime
from shared.settings.api_token import read_token_file, token_path
from tests.scheduler_support import cli_env, free_port, run_cli, wait_until, write_home

# `up` and `restart` wait until each process is really up: seconds each on a loaded two-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
SLOW = 300

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def _states(home: Path, env: dict[str, str]) -> dict[str, dict[str, object]]:
    # Polled through supervisord's XML-RPC directly: a CLI run per poll would make each poll a second long.
    p = supervise.paths(home)
    if not supervise.is_running(p):
        return {}
    return {s["name"]: s for s in supervise.process_info(p)}


@pytest.fixture
def up_home(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str], int]]:
    port = free_port()
    agent_cmd = json.dumps(
        [sys.executable, "-c", "import sys, time; sys.stdin.read(); time.sleep(2); print('done')"]
    )
    agents = (
        f'[agents.assistant]\nname = "A"\nprovider = "command"\ncommand = {agent_cmd}\n\n'
        '[agents.thinker]\nname = "T"\nprovider = "claude"\n'
    )
    extra = "[scheduler]\nrecover_interval_seconds = 1\n\n[processor]\n"
    home = write_home(
        tmp_path / "home",
        f"sqlite:///{tmp_path / 'home' / 'agentpost.db'}",
        extra,
        agents=agents,
        queue="max_retries = 5\nlease_seconds = 2",
    )
    env = cli_env(home, {"AGENTPOST_API_PORT": str(port)})
    yield home, env, port
    run_cli(home, "down", env=env, check=False, timeout=SLOW)


def test_up_starts_what_it_can_restarts_a_killed_process_and_down_stops_all(
    up_home: tuple[Path, dict[str, str], int],
) -> None:
    home, env, port = up_home
    expected = {"scheduler"} | {
        k for k, m in (("processor", "workers.processor"), ("web", "adapters.web.server")) if _importable(m)
    }
    out = run_cli(home, "up", env=env, timeout=SLOW)
    text = " ".join(out.stdout.split())  # rich wraps long lines
    for variable in (
        "TELEGRAM_BOT_TOKEN",
        "DISCORD_BOT_TOKEN",
        "WHATSAPP_ACCESS_TOKEN",
        "WHATSAPP_VERIFY_TOKEN",
    ):
        assert variable in text
    assert "agent thinker (claude): not logged in" in text and "ANTHROPIC_API_KEY" in text
    if "web" in expected:
        assert f"dashboard: http://127.0.0.1:{port}/" in text
    states = wait_until(
        lambda: (
            (s := _states(home, env))
            and all(s.get(k, {}).get("statename") == "RUNNING" for k in expected)
            and s
        ),
        30,
        what="every process RUNNING",
    )
    assert set(states) == expected, "only installed processes are started; channels without tokens are not"
    listed = json.loads(run_cli(home, "status", "--json", env=env).stdout)
    assert {p["name"]: p["statename"] for p in listed["processes"]} == dict.fromkeys(expected, "RUNNING")
    if "web" in expected:
        # No token was set anywhere: `up` made one in the home and printed the dashboard's sign-in link with
        # it; the web process found it there itself (no process was handed it), and asks for it.
        token = read_token_file(token_path(home))
        assert token and f"http://127.0.0.1:{port}/signin#{token}" in text
        assert stat.S_IMODE(token_path(home).stat().st_mode) == 0o600
        api = f"http://127.0.0.1:{port}/api/queue/status"
        assert httpx.get(api, timeout=10).status_code == 401
        assert httpx.get(api, headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code == 200

    # Queue messages, SIGKILL the scheduler (and the processor mid-run), and watch supervisord restart them.
    with open_runtime(home, env={}) as rt:
        ids = [
            rt.queue.intake.enqueue_message(
                ChatAddress("cli", "ann", conversation=f"c{i}"), f"job {i}"
            ).message_id
            for i in range(4)
        ]
    victims = ["scheduler"]
    if "processor" in expected:
        with open_runtime(home, env={}) as rt:
            wait_until(
                lambda: rt.db.read_scalar("SELECT COUNT(*) FROM messages WHERE status = 'processing'"),
                30,
                what="the processor to start a run",
            )
        victims.append("processor")
    old = {name: int(states[name]["pid"]) for name in victims}  # type: ignore[call-overload]
    for pid in old.values():
        os.kill(pid, signal.SIGKILL)
    wait_until(
        lambda: all(
            (s := _states(home, env)).get(n, {}).get("statename") == "RUNNING" and s[n]["pid"] != old[n]
            for n in victims
        ),
        40,
        what="supervisord to restart them",
    )
    if "processor" in expected:
        with open_runtime(home, env={}) as rt:
            done = wait_until(
                lambda: (
                    (rows := rt.db.read("SELECT message_id, status FROM messages ORDER BY id"))
                    and all(r["status"] == "completed" for r in rows)
                    and rows
                ),
                60,
                what="every message completed after the restart",
            )
            assert sorted(r["message_id"] for r in done) == sorted(ids)  # nothing lost
            replied = {r["message_id"] for r in rt.db.read("SELECT message_id FROM responses")}
            assert set(ids) <= replied
    else:
        with open_runtime(home, env={}) as rt:
            assert sorted(m["message_id"] for m in rt.db.read("SELECT message_id FROM messages")) == sorted(
                ids
            )

    pids = [int(s["pid"]) for s in _states(home, env).values()]  # type: ignore[call-overload]
    assert "stopped" in run_cli(home, "down", env=env).stdout
    assert run_cli(home, "status", env=env, check=False).returncode == 3
    for pid in pids:
        wait_until(lambda pid=pid: not _alive(pid), 20, what=f"process {pid} to end")


def test_restart_restarts_one_process_or_all_and_says_so_when_nothing_runs(
    up_home: tuple[Path, dict[str, str], int],
) -> None:
    home, env, _port = up_home
    idle = run_cli(home, "restart", env=env, check=False)
    assert idle.returncode == 3
    assert "not running" in idle.stderr and "agentpost up" in idle.stderr
    run_cli(home, "up", env=env, timeout=SLOW)

    def scheduler_running() -> dict[str, dict[str, object]]:
        s = _states(home, env)
        return s if s.get("scheduler", {}).get("statename") == "RUNNING" else {}

    states = wait_until(scheduler_running, 30, what="the scheduler RUNNING")
    others = {n: s["pid"] for n, s in states.items() if n != "scheduler"}
    old = int(str(states["scheduler"]["pid"]))
    out = run_cli(home, "restart", "scheduler", env=env, timeout=SLOW)
    assert "restarted scheduler" in out.stdout
    after = _states(home, env)
    assert after["scheduler"]["statename"] == "RUNNING" and after["scheduler"]["pid"] != old
    assert {n: s["pid"] for n, s in after.items() if n != "scheduler"} == others  # the others untouched
    assert not _alive(old)

    unknown = run_cli(home, "restart", "nosuch", env=env, check=False)
    assert unknown.returncode == 2 and "nosuch" in unknown.stderr and "scheduler" in unknown.stderr

    before = {n: s["pid"] for n, s in _states(home, env).items()}
    run_cli(home, "restart", env=env, timeout=SLOW)
    wait_until(
        lambda: all(
            (s := _states(home, env)).get(n, {}).get("statename") == "RUNNING" and s[n]["pid"] != before[n]
            for n in before
        ),
        40,
        what="every process restarted",
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie not yet reaped by supervisord (which has exited) is reaped by init; treat it as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# -- deployment files --------------------------------------------------------------------------------------
def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"{path.name}: bad line {raw!r}"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


SERVICES = {
    "agentpost-processor.service": "processor",
    "agentpost-scheduler.service": "scheduler",
    "agentpost-web.service": "web",
    "agentpost-channel@.service": "%i",
}


def test_systemd_units_have_the_fields_that_matter() -> None:
    units = DEPLOY / "systemd"
    assert sorted(p.name for p in units.iterdir()) == sorted([*SERVICES, "agentpost.target"])
    for name, kind in SERVICES.items():
        unit = _unit(units / name)
        service = unit["Service"]
        assert service["User"] == ["agentpost"] and service["Group"] == ["agentpost"], name
        assert service["Restart"] == ["on-failure"], name
        assert service["ExecStart"][0].split()[-2:] == ["run", kind], name
        assert service["ExecStart"][0].split()[0].endswith("/agentpost"), name
        assert "AGENTPOST_HOME=/var/lib/agentpost" in service["Environment"], name
        # Only its own secrets: the shared file, then the file of this process alone.
        assert service["EnvironmentFile"] == [
            "-/etc/agentpost/agentpost.env",
            f"-/etc/agentpost/{kind}.env",
        ], name
        assert unit["Unit"]["PartOf"] == ["agentpost.target"], name
        assert unit["Install"]["WantedBy"] == ["agentpost.target"], name
    target = _unit(units / "agentpost.target")
    wanted = set(" ".join(target["Unit"]["Wants"]).split())
    assert wanted == {n for n in SERVICES if "@" not in n}
    assert target["Install"]["WantedBy"] == ["multi-user.target"]
    sysusers = (DEPLOY / "sysusers.d" / "agentpost.conf").read_text()
    assert any(line.split()[:2] == ["u", "agentpost"] for line in sysusers.splitlines() if line.strip())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    agentpost = Path(sys.executable).with_name("agentpost")
    assert agentpost.exists()
    for unit in (DEPLOY / "systemd").iterdir():
        text = unit.read_text().replace("/opt/agentpost/.venv/bin/agentpost", str(agentpost))
        (tmp_path / unit.name).write_text(text)
    shutil.copy(tmp_path / "agentpost-channel@.service", tmp_path / "agentpost-channel@telegram.service")
    names = [
        str(tmp_path / n)
        for n in (
            *[s for s in SERVICES if "@" not in s],
            "agentpost.target",
            "agentpost-channel@telegram.service",
        )
    ]
    out = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *names],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"},
    )
    assert out.returncode == 0, out.stderr
    problems = [line for line in out.stderr.splitlines() if str(tmp_path) in line]
    assert problems == [], out.stderr


def test_supervisord_conf_runs_every_process_with_autorestart() -> None:
    parser = configparser.RawConfigParser()
    parser.read(DEPLOY / "supervisord.conf")
    programs = {s.split(":", 1)[1]: parser[s] for s in parser.sections() if s.startswith("program:")}
    assert {"processor", "scheduler", "web", "telegram", "discord", "whatsapp"} <= set(programs)
    for name, section in programs.items():
        assert section["command"].split()[-2:] == ["run", name]
        assert section["autorestart"] == "true" and section["stopsignal"] == "TERM"
        assert 'AGENTPOST_HOME="/var/lib/agentpost"' in section["environment"]
    assert parser["supervisord"]["user"] == "agentpost"
    assert {programs[n]["autostart"] for n in ("processor", "scheduler", "web")} == {"true"}
