"""The pieces `agentpost up` and `agentpost run web` stand on: who listens on a port (read from the real
/proc of real processes), and the environment the launcher gives a process under supervisord."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler import launch, process_plan, supervise
from shared import port_owner
from tests.probes import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET6)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0))
    sock.listen()
    yield sock
    sock.close()


def test_the_listening_process_is_named_with_its_command_and_a_free_port_has_none(
    listening: socket.socket,
) -> None:
    port = listening.getsockname()[1]
    found = port_owner.listeners(port)
    assert [h.pid for h in found] == [os.getpid()]
    own_program = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode()  # pytest, or its worker
    assert found[0].describe().startswith(f"pid {os.getpid()} ({own_program}")
    assert port_owner.describe_holder(port) == found[0].describe()
    assert port_owner.listeners(free_port()) == []  # a port nobody listens on
    # A connected (not listening) socket on another port is not a holder of that port.
    client = socket.create_connection(("127.0.0.1", port))
    try:
        assert port_owner.listeners(client.getsockname()[1]) == []
    finally:
        client.close()


def test_the_launcher_replaces_the_managed_variables_and_keeps_the_rest(tmp_path: Path) -> None:
    spec = {
        "prefixes": ["AGENTPOST_", "TELEGRAM_"],
        "names": ["EXTRA_TOKEN"],
        "values": {"AGENTPOST_HOME": "/h", "TELEGRAM_BOT_TOKEN": "new"},
    }
    base = {
        "PATH": "/bin",
        "AGENTPOST_API_PORT": "1",  # unset in the shell of the latest `up`: removed
        "TELEGRAM_BOT_TOKEN": "old",
        "EXTRA_TOKEN": "x",
        "DISCORD_BOT_TOKEN": "d",  # not this process's: left as it is
    }
    assert launch.environment(base, spec) == {
        "PATH": "/bin",
        "DISCORD_BOT_TOKEN": "d",
        "AGENTPOST_HOME": "/h",
        "TELEGRAM_BOT_TOKEN": "new",
    }

    # What `up` writes for a channel: its variables as the shell has them, and the home.
    p = supervise.paths(tmp_path)
    prog = process_plan.Program("telegram", [], ("AGENTPOST_", "TELEGRAM_"), ("TELEGRAM_BOT_TOKEN",))
    written = supervise.env_spec(p, prog, {"TELEGRAM_BOT_TOKEN": "t2", "DISCORD_BOT_TOKEN": "d"})
    assert written["values"] == {"AGENTPOST_HOME": str(tmp_path), "TELEGRAM_BOT_TOKEN": "t2"}
    assert supervise.changed_variables(written, spec) == ["AGENTPOST_HOME", "TELEGRAM_BOT_TOKEN"]
    assert supervise.changed_variables(None, spec) == []

    # The API token is the web process's alone: every other process loses it, even one whose prefixes match.
    shell = {"AGENTPOST_API_TOKEN": "api", "AGENTPOST_API_PORT": "4000", "PATH": "/bin"}
    for name in ("processor", "scheduler", "telegram", "web"):
        each = process_plan.Program(name, [], ("AGENTPOST_",))
        got = launch.environment(shell, supervise.env_spec(p, each, shell))
        assert got["AGENTPOST_API_PORT"] == "4000" and got["PATH"] == "/bin"
        assert got.get("AGENTPOST_API_TOKEN") == ("api" if name == "web" else None), name

    # Its file cannot be read: one plain line saying what to do, no traceback.
    missing = subprocess.run(
        [sys.executable, "-m", "scheduler.launch", str(tmp_path / "gone.json"), "web"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 1 and "agentpost up" in missing.stderr and "Traceback" not in missing.stderr
