"""Every place the sandbox hides, one by one: a file the test puts in agentpost's home, the folder of the
SQLite database (kept outside the home here), the service user's home, the host's ``/tmp``, ``/var/tmp``,
``/run`` and ``/dev/shm``, read by a command agent in a real processor process. Each is read with
``sandbox = "none"`` (the control: the probe finds what it looks for) and none in the sandbox, so a sandbox
that stopped hiding any one of them fails here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from tests.e2e.test_sandbox import _need_bwrap
from tests.homes import open_home
from tests.probes import wait_for
from tests.processor_support import make_home

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(180),
    pytest.mark.skipif(os.geteuid() != 0, reason="writes to /run and /dev/shm"),
]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))

PROBE = r"""
while read -r name path; do
  if cat "$path" >/dev/null 2>&1; then echo "$name READ"; else echo "$name DENIED"; fi
done < "$AP_PLACES"
"""


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A folder outside /tmp (which the sandbox empties as a whole, and would hide everything under it)."""
    folder = Path(tempfile.mkdtemp(prefix="agentpost-hidden-test-", dir="/var/lib"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_every_hidden_place_is_hidden(outside_tmp: Path, sandbox: str) -> None:
    _need_bwrap()
    tmp = outside_tmp
    tag = uuid.uuid4().hex[:8]
    service_home = tmp / "service-home"
    db_dir = tmp / "db"
    for folder in (service_home, db_dir):
        folder.mkdir()
    home = tmp / "home"
    script = tmp / "probe.sh"
    script.write_text(PROBE)
    agents = {"prober": {"provider": "command", "command": ["/bin/sh", str(script)]}}
    make_home(tmp, f"sqlite:///{db_dir / 'agentpost.db'}", agents, processor={"sandbox": sandbox})
    places = {
        "agentpost-home": home / f"secret-{tag}.txt",
        "database-folder": db_dir / f"secret-{tag}.txt",
        "service-home": service_home / f"secret-{tag}.txt",
        "tmp": Path(f"/tmp/agentpost-hidden-{tag}.txt"),
        "var-tmp": Path(f"/var/tmp/agentpost-hidden-{tag}.txt"),
        "run": Path(f"/run/agentpost-hidden-{tag}.txt"),
        "dev-shm": Path(f"/dev/shm/agentpost-hidden-{tag}.txt"),
    }
    for path in places.values():
        path.write_text("secret\n")
        path.chmod(0o644)  # readable by anyone who can reach it: only hiding keeps the agent out
    # The list of places goes to the agent through its workspace, which it may read.
    workspace = home / "workspace" / "prober"
    workspace.mkdir(parents=True)
    places_file = workspace / "places.txt"
    places_file.write_text("".join(f"{name} {path}\n" for name, path in places.items()))
    text = (home / "settings.toml").read_text()
    text = text.replace("[agents.prober]\n", f'[agents.prober]\nenv = {{ AP_PLACES = "{places_file}" }}\n', 1)
    (home / "settings.toml").write_text(text)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(service_home),
        "AGENTPOST_HOME": str(home),
    }
    try:
        with open_home(home) as rt:
            sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "probe", agent="prober")
            log = tmp / "processor.out"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
                )

                def replied() -> object:
                    assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                    return rt.db.read_scalar(
                        "SELECT message FROM responses WHERE message_id = :m", {"m": sent.message_id}
                    )

                try:
                    reply = str(wait_for(replied, 60, "the probe's reply"))
                finally:
                    proc.kill()
                    proc.wait(timeout=10)
    finally:
        for path in places.values():
            path.unlink(missing_ok=True)
    verdicts = dict(line.split(" ", 1) for line in reply.splitlines() if " " in line)
    assert set(verdicts) == set(places), reply
    expected = "READ" if sandbox == "none" else "DENIED"
    assert verdicts == dict.fromkeys(places, expected), reply
