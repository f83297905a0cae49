"""What an agent can reach, tried as an attacker would: a real processor process runs an agent that probes the
database, the settings, another agent's workspace and every process's environment for a channel token, and
writes to its own workspace — as root (the CLI then runs as the sandbox user) and as an unprivileged service
user (bubblewrap in a user namespace of its own). With ``[processor] sandbox = "none"`` the same probe reads
all of it, which is what the sandbox takes away (and shows the probe can find what it looks for)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared.chat.address import ChatAddress
from tests.fakes.anthropic_api import (
    JSON,
    Computed,
    FakeAnthropic,
    Reply,
    ToolUse,
    last_user_text,
    tool_results,
)
from tests.fakes.claude_env import claude_binary, claude_env
from tests.files_in_support import DOC, reader
from tests.homes import open_home
from tests.probes import free_port, service_unavailable, wait_for
from tests.processor_support import make_home
from workers.sandbox import SandboxView, bwrap_argv, choose, prepare

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))
TOKEN = "123456:sandbox-probe-telegram-token"
#: The unprivileged account the "service runs as a normal user" tests run the processor as.
SERVICE_USER = "agentpost-svc-test"

#: The probe a command agent runs: one line per thing it tries, READ/DENIED (WROTE/DENIED for its workspace).
PROBE = r"""
probe() { if cat "$1" >/dev/null 2>&1; then echo "READ $2"; else echo "DENIED $2"; fi; }
probe "$AP_HOME/agentpost.db" database
probe "$AP_HOME/settings.toml" settings
probe "$AP_HOME/workspace/other/notes.txt" other-workspace
found=DENIED
for f in /proc/[0-9]*/environ; do
  if tr '\0' '\n' < "$f" 2>/dev/null | grep -q "^TELEGRAM_BOT_TOKEN="; then found=READ; fi
done
echo "$found token-environ"
if echo mine > own.txt && [ "$(cat own.txt)" = mine ]; then echo "WROTE workspace"; else echo "DENIED workspace"; fi
"""


def _need_bwrap() -> None:
    if shutil.which("bwrap") is None:
        service_unavailable("bubblewrap", "bwrap is not installed (.ci/install-system-packages installs it)")


def _probe_home(tmp: Path, sandbox: str | None) -> Path:
    home = tmp / "home"  # what make_home below creates
    script = tmp / "probe.sh"
    script.write_text(PROBE)
    script.chmod(0o755)
    agents = {
        "prober": {"provider": "command", "command": ["/bin/sh", str(script)], "env": {"AP_HOME": str(home)}},
        "other": {"provider": "command", "command": ["/bin/true"]},
    }
    processor = {"sandbox": sandbox} if sandbox else None
    built = make_home(tmp, f"sqlite:///{home / 'agentpost.db'}", agents, processor=processor)
    assert built == home
    (built / "workspace" / "other").mkdir(parents=True, exist_ok=True)
    (built / "workspace" / "other" / "notes.txt").write_text("the other agent's notes\n")
    return built


@contextmanager
def _token_holder(env: dict[str, str]) -> Iterator[None]:
    """A long-lived process holding a channel token in its environment, as a channel adapter does."""
    holder = subprocess.Popen(["sleep", "300"], env={**env, "TELEGRAM_BOT_TOKEN": TOKEN})
    try:
        yield
    finally:
        holder.kill()
        holder.wait(timeout=10)


def _give(home: Path, owner: tuple[int, int]) -> None:
    for base, dirs, files in os.walk(home):
        for name in (*dirs, *files):
            os.chown(os.path.join(base, name), *owner)
    os.chown(home, *owner)


def _run_probe(
    home: Path, argv_prefix: list[str], env: dict[str, str], owner: tuple[int, int] | None = None
) -> dict[str, str]:
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "probe", agent="prober")
        if owner is not None:
            _give(home, owner)  # the database this test just wrote belongs to the service user
        log = home.parent / "processor.out"
        out = log.open("wb")
        proc = subprocess.Popen(
            [*argv_prefix, AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
        )

        def replied() -> object:
            assert proc.poll() is None, f"the processor exited: {log.read_text(errors='replace')[-3000:]}"
            return rt.db.read_scalar(
                "SELECT message FROM responses WHERE message_id = :m", {"m": sent.message_id}
            )

        try:
            reply = wait_for(replied, 60, "the probe's reply")
        finally:
            proc.kill()
            proc.wait(timeout=10)
            out.close()
    verdicts = dict(reversed(line.split(" ", 1)) for line in str(reply).splitlines() if " " in line)
    assert set(verdicts) >= {"database", "settings", "other-workspace", "token-environ", "workspace"}, reply
    return verdicts


def _base_env(home: Path, tmp: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "LANG": "C.UTF-8",
        "AGENTPOST_HOME": str(home),
        "TELEGRAM_BOT_TOKEN": TOKEN,  # what supervisord used to hand every process
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="the service-runs-as-root case")
@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_an_agent_of_a_root_service_reaches_only_its_workspace(tmp_path: Path, sandbox: str) -> None:
    _need_bwrap()
    home = _probe_home(tmp_path, sandbox)
    env = _base_env(home, tmp_path)
    with _token_holder(env):
        verdicts = _run_probe(home, [], env)
    assert verdicts["workspace"] == "WROTE"
    own = home / "workspace" / "prober" / "own.txt"
    assert own.read_text() == "mine\n"
    if sandbox == "none":
        # What the sandbox takes away: with none, one run reads all of it.
        assert {verdicts[k] for k in ("database", "settings", "other-workspace", "token-environ")} == {"READ"}
        return
    assert verdicts == {
        "database": "DENIED",
        "settings": "DENIED",
        "other-workspace": "DENIED",
        "token-environ": "DENIED",
        "workspace": "WROTE",
    }
    # The CLI ran as the agent's own user (in the agents' group), which owns what it wrote.
    assert pwd.getpwuid(own.stat().st_uid).pw_name == "ap-prober"
    assert own.stat().st_gid == pwd.getpwnam("agentpost-agent").pw_gid


@pytest.fixture
def service_tmp() -> Iterator[Path]:
    """A folder the service user can reach (pytest's own temporary folders are 0700, root's)."""
    folder = Path(tempfile.mkdtemp(prefix="agentpost-svc-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _service_user() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group",
             SERVICE_USER],
            check=True, capture_output=True,
        )  # fmt: skip
        entry = pwd.getpwnam(SERVICE_USER)
    return entry.pw_uid, entry.pw_gid


def _as_service_user(uid: int, gid: int) -> list[str]:
    """Run a command as the unprivileged service user. This machine's Python lives under /root (0700), so the
    command gets a mount namespace of its own where /root is an empty folder with the interpreter bound back —
    what a service user's machine looks like, where the interpreter is readable by everyone."""
    prefix = Path(sys.base_prefix)
    script = (
        'set -e; mkdir -p "$1"; mount --bind "$2" "$1"; mount -t tmpfs -o mode=0755 tmpfs /root; '
        'mkdir -p "$2"; mount --bind "$1" "$2"; shift 2; exec "$@"'
    )
    keep = f"/tmp/agentpost-sandbox-test-{os.getpid()}"
    return [
        "unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", keep, str(prefix),
        "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--",
    ]  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create the service user it runs as")
def test_an_agent_of_a_non_root_service_reaches_only_its_workspace(service_tmp: Path) -> None:
    _need_bwrap()
    uid, gid = _service_user()
    tmp_path = service_tmp
    home = _probe_home(tmp_path, "auto")
    env = _base_env(home, tmp_path)
    with _token_holder(env):
        verdicts = _run_probe(home, _as_service_user(uid, gid), env, owner=(uid, gid))
    assert verdicts == {
        "database": "DENIED",
        "settings": "DENIED",
        "other-workspace": "DENIED",
        "token-environ": "DENIED",
        "workspace": "WROTE",
    }


# -- the real claude CLI inside the sandbox ------------------------------------------------------------------


def _bash_then_answer(body: JSON) -> str | Reply:
    """The scripted model: ``[file: …]`` prompts are read with the Read tool; "probe" runs the probe in the
    Bash tool and answers with its output; "attach" writes a file and attaches it; anything else is answered
    with how many user turns the conversation holds (a resumed session has more)."""
    text = last_user_text(body)
    if "[file:" in text:
        return reader(body)
    results = tool_results(body)
    if "probe" in text:
        if not results:
            return ToolUse("Bash", {"command": PROBE, "description": "Probe"})
        return "\n".join(str(r.get("content", "")) for r in results) if results else ""
    if "attach" in text:
        if not results:
            return ToolUse("Bash", {"command": "echo report > report.txt", "description": "Write it"})
        return "Here it is. [send_file: report.txt]"
    turns = sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "user")
    return f"turns={turns}"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to be root, or to create the service user)")
@pytest.mark.parametrize("service", ["root", "service-user"])
@pytest.mark.parametrize("warm", [0, 60], ids=["cold", "warm"])
def test_the_claude_cli_answers_resumes_reads_uploads_and_attaches_inside_the_sandbox(
    service_tmp: Path, service: str, warm: int
) -> None:
    """``warm``: ``[processor] session_idle_seconds``; with 60 the chat's messages after the first are written
    to one kept CLI process (workers/providers/claude_warm.py), which must be confined the same way."""
    _need_bwrap()
    try:
        claude_binary()
    except FileNotFoundError as exc:
        service_unavailable("the claude CLI", exc)
    tmp_path = service_tmp
    owner = _service_user() if service == "service-user" else None
    prefix = _as_service_user(*owner) if owner else []
    with FakeAnthropic(default=Computed(_bash_then_answer)) as api:
        home = tmp_path / "home"
        agents = {
            "coder": {
                "provider": "claude",
                "permission_mode": "bypassPermissions",
                "env": {"AP_HOME": str(home)},
            },
        }
        built = make_home(
            tmp_path,
            f"sqlite:///{home / 'agentpost.db'}",
            agents,
            processor={"sandbox": "namespaces", "session_idle_seconds": warm},
        )
        assert built == home
        uploads = home / "files" / "cli" / "me"
        uploads.mkdir(parents=True)
        (uploads / "notes.txt").write_bytes(DOC)
        (uploads / "notes.txt").chmod(0o600)
        env = {**claude_env(api.base_url, tmp_path), "AGENTPOST_HOME": str(home), "TELEGRAM_BOT_TOKEN": TOKEN}
        with open_home(home) as rt:
            if owner:
                _give(home, owner)
            log = tmp_path / "processor.out"
            out = log.open("wb")
            proc = subprocess.Popen(
                [*prefix, AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
            )

            def ask(text: str) -> tuple[str, dict[str, object]]:
                sent = rt.queue.intake.enqueue_message(
                    ChatAddress("cli", "me", conversation="me"), text, agent="coder"
                )

                def answered() -> list[Any]:
                    assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                    return rt.db.read(
                        "SELECT message, files FROM responses WHERE message_id = :m", {"m": sent.message_id}
                    )

                rows = wait_for(answered, 90, f"the reply to {text!r}")
                return str(rows[0]["message"]), {"files": json.loads(rows[0]["files"] or "[]")}

            try:
                first, _ = ask("hello")
                second, _ = ask("again")
                probed, _ = ask("probe")
                read, _ = ask(f"what does this say? [file: {uploads / 'notes.txt'}]")
                attached, extra = ask("attach the report")
                done = rt.db.read("SELECT payload FROM events WHERE type = 'chain_step_done' ORDER BY id")
                pids = [json.loads(row["payload"])["pid"] for row in done]
            finally:
                proc.kill()
                proc.wait(timeout=10)
                out.close()
    # The probe really looked where the database and settings are.
    assert (home / "agentpost.db").exists() and (home / "settings.toml").exists()
    assert first == "turns=1" and second.startswith("turns=") and int(second.split("=")[1]) > 1, (
        first,
        second,
    )
    assert "DENIED database" in probed and "DENIED settings" in probed and "DENIED token-environ" in probed
    assert "WROTE workspace" in probed, probed
    assert "READ OK notes.txt" in read and "PELICAN-7" in read, read
    files = [Path(f) for f in extra["files"]]  # type: ignore[union-attr]
    assert [f.name for f in files] == ["report.txt"] and files[0].read_text() == "report\n", attached
    # Cold: a CLI per message; warm: every message of the chat went to the one kept (and confined) process.
    assert len(pids) == 5 and len(set(pids)) == (1 if warm else 5), pids


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create the service user it runs as")
def test_an_agentpost_process_hides_its_environment_from_its_own_user(service_tmp: Path) -> None:
    """Another process of the service user — an agent's command where no sandbox can be had — cannot read
    a running agentpost process's environment (its channel token): every process is non-dumpable."""
    uid, gid = _service_user()
    tmp_path = service_tmp
    home = _probe_home(tmp_path, None)
    _give(home, (uid, gid))
    env = {**_base_env(home, tmp_path), "AGENTPOST_API_PORT": str(free_port())}
    proc = subprocess.Popen(
        [*_as_service_user(uid, gid), AGENTPOST, "run", "web"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        def agentpost_pid() -> int | None:
            # The process the wrappers became (same pid through exec) once it runs agentpost's code.
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
            return proc.pid if argv[-4:-1] == [AGENTPOST.encode(), b"run", b"web"] else None

        pid = wait_for(agentpost_pid, 30, "agentpost run web to start")

        def serving() -> bool:
            try:
                return httpx.get(
                    f"http://127.0.0.1:{env['AGENTPOST_API_PORT']}/healthz", timeout=1
                ).is_success
            except httpx.HTTPError:
                return False

        wait_for(serving, 60, "agentpost run web to serve")
        assert b"AGENTPOST_HOME" in Path(f"/proc/{pid}/environ").read_bytes()  # root still can
        peek = subprocess.run(
            ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", "cat", f"/proc/{pid}/environ"],
            capture_output=True,
        )  # fmt: skip
        assert proc.poll() is None, "agentpost run web exited: the probe proves nothing"
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    assert TOKEN.encode() not in peek.stdout
    assert peek.returncode != 0 and b"Permission denied" in peek.stderr, peek


def _doctor_sandbox(home: Path, path: str, **extra: str) -> dict[str, str]:
    env = {"PATH": path, "HOME": str(home), "AGENTPOST_HOME": str(home), "NO_COLOR": "1", **extra}
    out = subprocess.run(
        [AGENTPOST, "doctor", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    found = {(c["area"], c["name"]): c for c in json.loads(out.stdout)}
    return dict(found[("agents", "sandbox")])


def test_doctor_says_which_sandbox_agents_get_and_fails_without_one_for_bypassing_agents(
    tmp_path: Path,
) -> None:
    _need_bwrap()
    agents = {
        "coder": {"provider": "command", "command": ["/bin/true"], "permission_mode": "bypassPermissions"}
    }
    home = make_home(
        tmp_path, f"sqlite:///{tmp_path / 'home' / 'agentpost.db'}", agents, processor={"sandbox": "auto"}
    )
    confined = _doctor_sandbox(home, "/usr/bin:/bin")
    assert confined["level"] == "ok" and "confined" in confined["detail"], confined
    # No bubblewrap on the PATH: the agents would run with agentpost's rights, and this one runs commands.
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    exposed = _doctor_sandbox(home, str(empty))
    assert exposed["level"] == "fail", exposed
    assert "bubblewrap is not installed" in exposed["detail"] and "coder" in exposed["detail"]
    assert "apt-get install bubblewrap" in exposed["fix"]
    # Turned off on purpose: said just as plainly.
    off = _doctor_sandbox(home, "/usr/bin:/bin", AGENTPOST_SANDBOX="none")
    assert off["level"] == "fail" and "own rights" in off["detail"], off


def _sandboxed_sleepers(marker: str) -> list[int]:
    """Processes still running the sleeper script with ``marker`` (the agent's tree, inside its sandbox)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:1] == [b"sleep"] and marker.encode() in argv:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="the service-runs-as-root case")
def test_a_sandboxed_run_is_killed_whole_by_its_timeout_and_with_a_killed_processor(tmp_path: Path) -> None:
    _need_bwrap()
    marker = f"4{os.getpid() % 1000:03d}.5"  # an unusual sleep length names this test's sleepers
    script = tmp_path / "sleeper.sh"
    script.write_text(f"sleep {marker} &\nsleep {marker}\n")
    agents = {
        "slow": {"provider": "command", "command": ["/bin/sh", str(script)], "timeout_seconds": 4},
    }
    home = make_home(
        tmp_path, f"sqlite:///{tmp_path / 'home' / 'agentpost.db'}", agents, processor={"sandbox": "auto"}
    )
    env = _base_env(home, tmp_path)
    with open_home(home) as rt:
        first = rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "take your time", agent="slow")
        log = (tmp_path / "processor.out").open("wb")
        proc = subprocess.Popen(
            [AGENTPOST, "run", "processor"], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            # The timeout ends the run and everything it started inside the sandbox.
            sleepers = wait_for(lambda: len(_sandboxed_sleepers(marker)) == 2, 60, "the run's two sleepers")
            assert sleepers
            owner = Path(f"/proc/{_sandboxed_sleepers(marker)[0]}").stat().st_uid
            assert pwd.getpwuid(owner).pw_name == "ap-slow"
            wait_for(lambda: not _sandboxed_sleepers(marker), 30, "the timed-out run's processes to end")
            wait_for(
                lambda: rt.db.read_scalar(
                    "SELECT retry_count FROM messages WHERE message_id = :m", {"m": first.message_id}
                ),
                30,
                "the timeout counted as an attempt",
            )
            # A processor killed outright takes the sandboxed run with it.
            wait_for(lambda: len(_sandboxed_sleepers(marker)) == 2, 60, "the retried run's sleepers")
            proc.kill()
            proc.wait(timeout=10)
            wait_for(
                lambda: not _sandboxed_sleepers(marker), 30, "the run's processes to die with the processor"
            )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            log.close()


def test_a_home_inside_a_folder_only_root_may_enter_is_reachable_by_the_sandboxed_agent(
    tmp_path: Path,
) -> None:
    """An agentpost home under root's own home (0700), with the service's HOME elsewhere: the agent, run as
    the sandbox user, still reaches its CLI home and workspace by their full paths (the soak found every
    resumed conversation failing there)."""
    _need_bwrap()
    if os.geteuid() != 0:
        pytest.skip("needs root: the sandbox drops to its own user only when the service runs as root")
    # Outside /tmp (the sandbox empties that and remakes the way to what it shows), like /root itself.
    private = Path(tempfile.mkdtemp(prefix="agentpost-test-root-only-", dir=pwd.getpwuid(0).pw_dir))
    private.chmod(0o700)
    try:
        _reach_inside(private)
    finally:
        shutil.rmtree(private)


def _reach_inside(private: Path) -> None:
    view = SandboxView(
        workspace=private / "home" / "workspaces" / "a", cli_home=private / "home" / "cli" / "a"
    )
    plan = choose("namespaces")
    assert plan.user is not None, plan
    prepare(plan, view, None)
    (view.cli_home / "session.jsonl").write_text("{}\n")
    os.chown(view.cli_home / "session.jsonl", *plan.user)
    script = f"cat {view.cli_home}/session.jsonl && touch {view.workspace}/written && id -u"
    done = subprocess.run(
        bwrap_argv(plan, view, ["sh", "-c", script]), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["{}", str(plan.user[0])]
    assert (view.workspace / "written").exists()
    assert not any(
        p.name == "root-only" for p in Path("/").iterdir()
    )  # only its parts are shown, not the folder
