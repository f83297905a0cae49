"""The heartbeat file through the API (``GET``/``PUT /api/agents/{agent}/heartbeat``): the web process
(root, on a root service) reads and writes ``heartbeat.md`` in the agent's workspace, where the agent may have
put a symbolic link to a host file, a FIFO, a link to ``/dev/zero`` or a hard link. The answer shows none of
the host file, nothing blocks, and a save replaces the name instead of writing through it."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.runtime import Runtime
from tests.web_support import LiveServer, home_runtime

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

SECRET = "HOST-SECRET: not the agent's\n"


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    yield from home_runtime(tmp_path)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "devzero", "hardlink"])
def test_the_heartbeat_file_is_neither_read_nor_written_through(
    rt: Runtime, tmp_path: Path, kind: str
) -> None:
    host = tmp_path / "host-file"
    host.write_text(SECRET)
    host.chmod(0o600)
    workspace = rt.settings.workspace("alpha")
    workspace.mkdir(parents=True)
    planted = workspace / "heartbeat.md"
    if kind == "symlink":
        planted.symlink_to(host)
    elif kind == "fifo":
        os.mkfifo(planted)
    elif kind == "devzero":
        planted.symlink_to("/dev/zero")
    else:
        os.link(host, planted)
    with LiveServer(rt) as server, server.client() as client:
        got = client.get("/api/agents/alpha/heartbeat")
        assert got.status_code == 200 and got.json()["content"] == ""
        put = client.put("/api/agents/alpha/heartbeat", json={"content": "Check the build."})
        assert put.status_code == 200, put.text
        assert client.get("/api/agents/alpha/heartbeat").json()["content"] == "Check the build."
    assert host.read_text() == SECRET and stat.S_IMODE(host.stat().st_mode) == 0o600
    st = planted.lstat()
    assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and planted.read_text() == "Check the build."
