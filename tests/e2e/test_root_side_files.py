"""The root side never follows an agent's files (shared/safe_files.py), tried as an agent would: a real
processor process as root runs command agents in the real bubblewrap sandbox (as their own users); each
run plants, in a file agentpost's side opens later, a symbolic link to a host file, a FIFO, a link to a zero
device, or (planted by the test, since ``fs.protected_hardlinks`` keeps the agent's user from linking a root
file) a hard link to a root-only file. Then the real scheduler (``heartbeat.md``) or the processor's next run
(the workspace marker, the Claude login copied into the CLI home, the handover of a workspace) acts on it.

Each host file must come out as it went in, nothing may block, and what an agent points at never reaches a
prompt. The zero device is a node of the test's own (``mknod c 1 5``), so a regression chmods that node and
not the machine's ``/dev/zero``."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.settings.sections import DEFAULT_HEARTBEAT_PROMPT
from tests.homes import build_home, open_home
from tests.probes import service_unavailable, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="the root side: the processor and scheduler as root"),
]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))
SECRET = "HOST-SECRET-4f1c: only root may read this\n"
KINDS = ("symlink", "fifo", "devzero", "hardlink")

#: What an agent run plants: $1 is the name (in its workspace or its home), $AP_KIND the kind, $AP_TARGET the
#: host file a link points at, $AP_ZERO the zero device. A hard link is planted by the test.
PLANT = r"""
plant() {
  rm -f "$1"
  case "$AP_KIND" in
    symlink) ln -s "$AP_TARGET" "$1" ;;
    fifo) mkfifo "$1" ;;
    devzero) ln -s "$AP_ZERO" "$1" ;;
    hardlink) echo "the test links $1" > "$1" ;;
  esac
}
"""


def _need_bwrap() -> None:
    if shutil.which("bwrap") is None:
        service_unavailable("bubblewrap", "bwrap is not installed (.ci/install-system-packages installs it)")


class Host:
    """The host files an agent points at: each root's, 0600, with a known content and an old mtime."""

    def __init__(self, tmp: Path) -> None:
        self.folder = tmp / "host"
        self.folder.mkdir()
        self.zero = self.folder / "zero"
        os.mknod(self.zero, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
        self.zero.chmod(0o666)  # past the umask
        self.files: dict[str, Path] = {}

    def target(self, name: str) -> Path:
        path = self.folder / name
        path.write_text(SECRET)
        path.chmod(0o600)
        os.utime(path, (946684800, 946684800))  # older than any login: a copy would write it
        self.files[name] = path
        return path

    def assert_untouched(self) -> None:
        for path in self.files.values():
            st = path.stat()
            assert path.read_text() == SECRET, f"{path} was written"
            assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o600), f"{path} was changed"
        st = self.zero.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o666), "the zero device was changed"


def _home(tmp: Path, agents: Mapping[str, Mapping[str, Any]], **extra: Any) -> Path:
    home = build_home(
        tmp, f"sqlite:///{tmp / 'home' / 'agentpost.db'}", agents, processor={"sandbox": "auto"}, extra=extra
    )
    login = tmp / "operator" / ".claude" / ".credentials.json"
    login.parent.mkdir(parents=True)
    login.write_text('{"claudeAiOauth": {"accessToken": "operator-login"}}')
    return home


def _env(home: Path, tmp: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp / "operator"),  # whose Claude login each CLI home gets a copy of
        "LANG": "C.UTF-8",
        "AGENTPOST_HOME": str(home),
    }


def _agent(script: Path, kind: str, target: Path, host: Host) -> dict[str, Any]:
    return {
        "provider": "command",
        "command": ["/bin/sh", str(script)],
        "env": {"AP_KIND": kind, "AP_TARGET": str(target), "AP_ZERO": str(host.zero)},
        "timeout_seconds": 30,
    }


@contextmanager
def _processor(home: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    log = home.parent / "processor.out"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _replies(home: Path, proc: subprocess.Popen[bytes], sent: Mapping[str, str], what: str) -> dict[str, str]:
    """Wait for a reply to each message in ``sent`` (agent -> message id); the replies by agent."""
    log = home.parent / "processor.out"
    with open_home(home) as rt:

        def all_replied() -> dict[str, str] | None:
            assert proc.poll() is None, f"the processor exited: {log.read_text(errors='replace')[-3000:]}"
            got = {}
            for agent, message_id in sent.items():
                text = rt.db.read_scalar(
                    "SELECT message FROM responses WHERE message_id = :m", {"m": message_id}
                )
                if text is None:
                    return None
                got[agent] = str(text)
            return got

        replies: dict[str, str] = wait_for(all_replied, 60, what)
    # A reply names its agent when several answer one chat ("**fifo:** …"): only the text after matters.
    return {agent: text.split(":** ", 1)[-1] for agent, text in replies.items()}


def _cli_home(home: Path, agent: str) -> Path:
    """The one CLI home ``agent``'s runs have had (one chat here): the chat's own, or the agent's."""
    found = [p for p in (home / "sandbox").glob(f"**/{agent}/**/.claude") if p.is_dir()]
    homes = {p.parent for p in found}
    assert len(homes) == 1, homes
    return homes.pop()


def _send(home: Path, texts: Mapping[str, str]) -> dict[str, str]:
    with open_home(home) as rt:
        return {
            agent: rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), text, agent=agent).message_id
            for agent, text in texts.items()
        }


# -- heartbeat.md, read by the scheduler ---------------------------------------------------------------------


def test_the_scheduler_sends_the_default_heartbeat_not_what_heartbeat_md_points_at(tmp_path: Path) -> None:
    _need_bwrap()
    host = Host(tmp_path)
    script = tmp_path / "plant.sh"
    script.write_text(PLANT + 'plant heartbeat.md\necho "planted $AP_KIND"\n')
    agents = {kind: _agent(script, kind, host.target(f"heartbeat-{kind}"), host) for kind in KINDS}
    home = _home(
        tmp_path,
        agents,
        scheduler={"catchup_seconds": 0},
        heartbeats={kind: {"interval": 1, "skip_when_busy": False} for kind in KINDS},
    )
    env = _env(home, tmp_path)
    with _processor(home, env) as proc:
        replies = _replies(home, proc, _send(home, dict.fromkeys(KINDS, "plant")), "the planting runs")
    assert replies == {kind: f"planted {kind}" for kind in KINDS}
    workspace = home / "workspace"
    assert (workspace / "symlink" / "heartbeat.md").is_symlink()
    assert stat.S_ISFIFO((workspace / "fifo" / "heartbeat.md").lstat().st_mode)
    os.remove(workspace / "hardlink" / "heartbeat.md")
    os.link(host.files["heartbeat-hardlink"], workspace / "hardlink" / "heartbeat.md")

    log = tmp_path / "scheduler.out"
    with log.open("ab") as out:
        scheduler = subprocess.Popen(
            [AGENTPOST, "run", "scheduler"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        with open_home(home) as rt:

            def two_beats_each() -> list[dict[str, Any]] | None:
                assert scheduler.poll() is None, log.read_text(errors="replace")[-3000:]
                rows = rt.db.read(
                    "SELECT agent, message FROM messages WHERE channel = 'heartbeat' ORDER BY id", {}
                )
                counts = {kind: sum(1 for r in rows if r["agent"] == kind) for kind in KINDS}
                return rows if min(counts.values()) >= 2 else None

            # Two slots each: a FIFO read would have stopped the scheduler at the first.
            beats = wait_for(two_beats_each, 60, "two heartbeats of every agent")
    finally:
        scheduler.terminate()
        try:
            scheduler.wait(timeout=20)
        except subprocess.TimeoutExpired:  # blocked (a FIFO read): stopped for good, then failed below
            scheduler.kill()
            scheduler.wait(timeout=10)
            raise
    assert {str(b["message"]) for b in beats} == {DEFAULT_HEARTBEAT_PROMPT}
    assert "HOST-SECRET" not in log.read_text()
    for kind in KINDS:
        assert f"heartbeat of {kind}: " in log.read_text(), f"no warning for {kind}"
    host.assert_untouched()


# -- the workspace marker and the Claude login, at the processor's next run ---------------------------------


def test_the_processor_neither_writes_through_the_login_nor_blocks_on_the_marker(tmp_path: Path) -> None:
    _need_bwrap()
    host = Host(tmp_path)
    script = tmp_path / "plant.sh"
    script.write_text(
        PLANT
        + 'if [ "$1" = plant ]; then\n'
        + '  AP_TARGET="$AP_TARGET-marker" plant .agentpost-workspace\n'
        + '  plant "$HOME/.claude/.credentials.json"\n'
        + "fi\n"
        + 'echo "run $1 $AP_KIND"\n'
    )
    agents = {}
    for kind in KINDS:
        host.target(f"login-{kind}-marker")
        agents[kind] = _agent(script, kind, host.target(f"login-{kind}"), host)
        agents[kind]["command"] = ["/bin/sh", str(script), "{prompt}"]
    home = _home(tmp_path, agents)
    env = _env(home, tmp_path)
    with _processor(home, env) as proc:
        first = _replies(home, proc, _send(home, dict.fromkeys(KINDS, "plant")), "the planting runs")
        assert first == {kind: f"run plant {kind}" for kind in KINDS}
        cli_homes = {kind: _cli_home(home, kind) for kind in KINDS}
        for kind in KINDS:
            assert (cli_homes[kind] / ".claude" / ".credentials.json").is_symlink() == (
                kind in ("symlink", "devzero")
            )
        for name in (".agentpost-workspace", ".claude/.credentials.json"):
            folder = home / "workspace" / "hardlink" if name.startswith(".a") else cli_homes["hardlink"]
            os.remove(folder / name)
            suffix = "-marker" if name.startswith(".a") else ""
            os.link(host.files[f"login-hardlink{suffix}"], folder / name)
        # The operator logs in again: the next run copies the newer login into each CLI home.
        login = tmp_path / "operator" / ".claude" / ".credentials.json"
        os.utime(login, (time.time() + 60, time.time() + 60))
        second = _replies(home, proc, _send(home, dict.fromkeys(KINDS, "again")), "the runs after planting")
    assert second == {kind: f"run again {kind}" for kind in KINDS}  # none blocked on a FIFO
    host.assert_untouched()
    said = (home.parent / "processor.out").read_text(errors="replace")
    for kind in KINDS:
        assert f"workspace/{kind}/.agentpost-workspace is not read" in said, f"no warning for {kind}"
    for kind in KINDS:
        copied = cli_homes[kind] / ".claude" / ".credentials.json"
        st = copied.lstat()
        assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1, f"{kind}: the login was not put in place"
        assert copied.read_text() == login.read_text()
        agent_uid = (home / "workspace" / kind).stat().st_uid  # the agent's own user
        assert agent_uid != 0 and (st.st_uid, stat.S_IMODE(st.st_mode)) == (agent_uid, 0o600)


# -- handing a workspace to the agent's user -----------------------------------------------------------------


def test_handing_over_a_workspace_gives_away_nothing_it_links_to(tmp_path: Path) -> None:
    _need_bwrap()
    host = Host(tmp_path)
    script = tmp_path / "plant.sh"
    script.write_text(
        PLANT
        + 'if [ "$1" = plant ]; then for k in symlink fifo devzero hardlink; do\n'
        + '  mkdir -p "deep/$k"; AP_KIND=$k AP_TARGET="$AP_TARGET-$k" plant "deep/$k/f"\n'
        + "done; fi\n"
        + 'echo "run $1"\n'
    )
    for kind in KINDS:
        host.target(f"owned-{kind}")
    agents = {"taker": _agent(script, "", host.folder / "owned", host)}
    agents["taker"]["command"] = ["/bin/sh", str(script), "{prompt}"]
    home = _home(tmp_path, agents)
    env = _env(home, tmp_path)
    workspace = home / "workspace" / "taker"
    with _processor(home, env) as proc:
        assert _replies(home, proc, _send(home, {"taker": "plant"}), "the planting run") == {
            "taker": "run plant"
        }
        hard = workspace / "deep" / "hardlink" / "f"
        os.remove(hard)
        os.link(host.files["owned-hardlink"], hard)
        # The workspace comes back to root (a restore from a backup, a change of the agent's user): the next
        # run hands the whole tree over again.
        os.chown(workspace, 0, 0)
        assert _replies(home, proc, _send(home, {"taker": "again"}), "the run after planting") == {
            "taker": "run again"
        }
    host.assert_untouched()
    assert workspace.stat().st_uid == (home / "workspace" / "taker" / "deep").stat().st_uid != 0


# -- [send_file: …] of a sandboxed run -----------------------------------------------------------------------


def test_a_reply_attaches_no_link_fifo_device_or_hard_link(tmp_path: Path) -> None:
    _need_bwrap()
    host = Host(tmp_path)
    script = tmp_path / "plant.sh"
    script.write_text(
        PLANT
        + "for k in symlink fifo devzero; do AP_KIND=$k plant $k.txt; done\n"
        + 'echo "here"; for k in symlink fifo devzero hardlink; do echo "[send_file: $k.txt]"; done\n'
    )
    agents = {"sender": _agent(script, "", host.target("sent"), host)}
    home = _home(tmp_path, agents)
    # The hard link is there before the first run (the agent's user may not link a root file itself).
    workspace = home / "workspace" / "sender"
    workspace.mkdir(parents=True)
    os.link(host.files["sent"], workspace / "hardlink.txt")
    with _processor(home, _env(home, tmp_path)) as proc:
        sent = _send(home, {"sender": "send them"})
        reply = _replies(home, proc, sent, "the reply")["sender"]
        with open_home(home) as rt:
            files = rt.db.read_scalar(
                "SELECT files FROM responses WHERE message_id = :m", {"m": sent["sender"]}
            )
    assert files in (None, "[]", []), files
    assert "HOST-SECRET" not in reply
    for line in (
        "(I couldn't attach symlink.txt: it is a link to a place outside my workspace.)",
        "(I couldn't attach fifo.txt: it is not a file.)",
        "(I couldn't attach devzero.txt: it is a link to a place outside my workspace.)",
        "(I couldn't attach hardlink.txt: it is a hard link to a file that may be outside my workspace.)",
    ):
        assert line in reply, reply
    host.assert_untouched()


# -- paths named in the message are not shown in the sandbox -------------------------------------------------


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_a_path_in_the_message_does_not_open_another_agents_files(tmp_path: Path, sandbox: str) -> None:
    """A command agent that takes the prompt as an argument: chat text naming another agent's workspace file
    and the Claude login in its CLI home reads neither in the sandbox (both with ``sandbox = "none"``,
    which shows the probe finds what it looks for)."""
    _need_bwrap()
    agents: dict[str, dict[str, Any]] = {
        "reader": {
            "provider": "command",
            "command": ["/bin/sh", "-c", 'cat "$1" 2>/dev/null || echo DENIED', "sh", "{prompt}"],
        },
        "other": {"provider": "command", "command": ["/bin/true"]},
    }
    home = build_home(
        tmp_path, f"sqlite:///{tmp_path / 'home' / 'agentpost.db'}", agents, processor={"sandbox": sandbox}
    )
    secret = home / "workspace" / "other" / "secret.txt"
    secret.parent.mkdir(parents=True)
    secret.write_text("the other agent's secret\n")
    login = home / "sandbox" / "other" / ".claude" / ".credentials.json"
    login.parent.mkdir(parents=True)
    login.write_text("the other agent's login\n")
    env = _env(home, tmp_path)
    with _processor(home, env) as proc:
        first = _replies(home, proc, _send(home, {"reader": str(secret)}), "the reply about the secret")
        second = _replies(home, proc, _send(home, {"reader": str(login)}), "the reply about the login")
    if sandbox == "none":
        assert (first["reader"], second["reader"]) == ("the other agent's secret", "the other agent's login")
    else:
        assert (first["reader"], second["reader"]) == ("DENIED", "DENIED")


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_a_configured_path_the_agent_turned_into_a_link_shows_nothing_more(
    tmp_path: Path, sandbox: str
) -> None:
    """An agent whose command names a path in its own workspace makes that path a link to another agent's
    workspace: the next run must not get the link's target shown in the sandbox (with ``sandbox = "none"``
    the link is simply followed: the control)."""
    _need_bwrap()
    home_path = tmp_path / "home"
    other = home_path / "workspace" / "other"
    agents: dict[str, dict[str, Any]] = {
        "linker": {
            "provider": "command",
            "command": [
                "/bin/sh",
                "-c",
                'cat "$1/secret.txt" 2>/dev/null || echo DENIED; rm -rf "$1"; ln -s "$AP_OTHER" "$1"',
                "sh",
                str(home_path / "workspace" / "linker" / "tools"),
            ],
            "env": {"AP_OTHER": str(other)},
        },
        "other": {"provider": "command", "command": ["/bin/true"]},
    }
    home = build_home(
        tmp_path, f"sqlite:///{home_path / 'agentpost.db'}", agents, processor={"sandbox": sandbox}
    )
    other.mkdir(parents=True)
    (other / "secret.txt").write_text("the other agent's secret\n")
    with _processor(home, _env(home, tmp_path)) as proc:
        first = _replies(home, proc, _send(home, {"linker": "make the link"}), "the first run")
        second = _replies(home, proc, _send(home, {"linker": "follow it"}), "the run after the link")
    assert first["linker"] == "DENIED"
    expected = "the other agent's secret" if sandbox == "none" else "DENIED"
    assert second["linker"] == expected
