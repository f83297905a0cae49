"""What the kernel and the CLI keep per user, per session and per home, tried from inside agent runs: a run
reading a secret in the processor's session keyring, two agents passing notes through the user keyring, and
one chat's claude run reading another chat's conversation transcript or loading what that run planted in the
CLI's home. Each is shown possible without the separation (``sandbox = "none"``, or one shared CLI home with
``session_scope = "agent"``: the control) and impossible with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from tests.e2e.test_sandbox import _need_bwrap, service_tmp
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
from tests.homes import open_home
from tests.probes import service_unavailable, wait_for
from tests.processor_support import make_home

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as their own users (needs root)"),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probe's keyctl numbers are x86_64's"),
]
__all__ = ["service_tmp"]

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))

#: Shared by the probes: the keyctl and add_key system calls (x86_64), by ctypes (no keyutils needed).
_KEYS = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
SESSION, USER = -3, -4

def add(name, payload, keyring):
    return libc.syscall(248, b"user", name.encode(), payload.encode(), len(payload), keyring)

def share_user_keyring():
    libc.syscall(250, 8, USER, SESSION)  # KEYCTL_LINK: the user's keyring into the session's, to possess it

def read(name, keyring):
    key = libc.syscall(250, 10, keyring, b"user", name.encode(), 0)  # KEYCTL_SEARCH
    if key < 0:
        return "DENIED"
    buf = ctypes.create_string_buffer(256)
    size = libc.syscall(250, 11, key, buf, 256)  # KEYCTL_READ
    return "READ " + buf.value.decode() if size >= 0 else "DENIED"
"""

#: The processor's start, as a service manager gives it: a session keyring of its own holding a secret.
_KEYRING_START = (
    _KEYS
    + r"""
import os
libc.syscall(250, 1, b"agentpost-service")  # KEYCTL_JOIN_SESSION_KEYRING, named
assert add("service-secret", "S3CRET", SESSION) > 0
os.execv(sys.argv[1], sys.argv[1:])
"""
)

_WRITER = (
    _KEYS
    + r"""
share_user_keyring()
add("note", "PASSED-ON", USER)
print("session-secret", read("service-secret", SESSION))
"""
)

_READER = (
    _KEYS
    + r"""
print("session-secret", read("service-secret", SESSION))
share_user_keyring()
print("user-note", read("note", SESSION))
"""
)


def _ask(home: Path, env: dict[str, str], prefix: list[str], asks: list[tuple[str, str, str]]) -> list[str]:
    """Send each (agent, chat, text) in turn, the next once the previous is answered; the replies."""
    replies = []
    with open_home(home) as rt:
        log = home.parent / "processor.out"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*prefix, AGENTPOST, "run", "processor"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
            try:
                for agent, chat, text in asks:
                    sent = rt.queue.intake.enqueue_message(
                        ChatAddress("telegram", chat, conversation=chat), text, agent=agent
                    )

                    def replied(message_id: str = sent.message_id) -> object:
                        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
                        return rt.db.read_scalar(
                            "SELECT message FROM responses WHERE message_id = :m AND status != 'x'",
                            {"m": message_id},
                        )

                    replies.append(str(wait_for(replied, 90, f"the reply to {text!r}")))
            finally:
                proc.kill()
                proc.wait(timeout=10)
    return replies


def _verdicts(reply: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in reply.splitlines() if " " in line)


@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_keyrings_are_neither_the_processors_nor_another_agents(service_tmp: Path, sandbox: str) -> None:
    _need_bwrap()
    tmp = service_tmp
    scripts = {}
    for name, text in (("start", _KEYRING_START), ("writer", _WRITER), ("reader", _READER)):
        scripts[name] = tmp / f"{name}.py"
        scripts[name].write_text(text)
    agents = {
        "writer": {"provider": "command", "command": ["/usr/bin/python3", str(scripts["writer"])]},
        "reader": {"provider": "command", "command": ["/usr/bin/python3", str(scripts["reader"])]},
    }
    home = make_home(
        tmp, f"sqlite:///{tmp / 'home' / 'agentpost.db'}", agents, processor={"sandbox": sandbox}
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "AGENTPOST_HOME": str(home)}
    wrote, read = _ask(
        home, env, [sys.executable, str(scripts["start"])], [("writer", "a", "go"), ("reader", "b", "go")]
    )
    writer, reader = _verdicts(wrote), _verdicts(read)
    if sandbox == "none":  # the control: one session keyring, one user: both pass
        assert writer["session-secret"] == "READ S3CRET" and reader["user-note"] == "READ PASSED-ON", (
            wrote,
            read,
        )
        return
    assert writer["session-secret"] == "DENIED" and reader["session-secret"] == "DENIED", (wrote, read)
    assert reader["user-note"] == "DENIED", read


def _remember_then_probe(body: JSON) -> str | Reply:
    """The scripted model: "remember" plants a file in the CLI's home with Bash and answers; "probe" looks
    for that file and for the remembered word in the CLI's transcripts, and answers with what it found."""
    text, results = last_user_text(body), tool_results(body)
    if results:
        return "\n".join(str(r.get("content", "")) for r in results)
    if "remember" in text:
        return ToolUse(
            "Bash", {"command": "echo planted > $HOME/planted-by-a && echo done", "description": "Plant"}
        )
    if "probe" in text:
        probe = (
            'echo "transcripts $(grep -rl "PELICAN-4[2]" $HOME/.claude/projects 2>/dev/null | wc -l)"; '
            'if [ -e $HOME/planted-by-a ]; then echo "planted FOUND"; else echo "planted ABSENT"; fi'
        )
        return ToolUse("Bash", {"command": probe, "description": "Probe"})
    return "ok"


@pytest.mark.parametrize("scope", ["conversation", "agent"])
def test_one_chats_claude_run_sees_nothing_of_anothers_conversation(service_tmp: Path, scope: str) -> None:
    _need_bwrap()
    try:
        claude_binary()
    except FileNotFoundError as exc:
        service_unavailable("the claude CLI", exc)
    tmp = service_tmp
    with FakeAnthropic(default=Computed(_remember_then_probe)) as api:
        agents = {
            "coder": {"provider": "claude", "permission_mode": "bypassPermissions", "session_scope": scope}
        }
        home = make_home(
            tmp, f"sqlite:///{tmp / 'home' / 'agentpost.db'}", agents, processor={"sandbox": "namespaces"}
        )
        env = {**claude_env(api.base_url, tmp), "AGENTPOST_HOME": str(home)}
        _, probed = _ask(
            home, env, [], [("coder", "alice", "remember PELICAN-42"), ("coder", "bob", "probe please")]
        )
    verdicts = _verdicts(probed)
    if scope == "agent":  # the control: one CLI home for every chat, and the probe finds both
        assert verdicts["transcripts"] != "0" and verdicts["planted"] == "FOUND", probed
        return
    assert verdicts == {"transcripts": "0", "planted": "ABSENT"}, probed
