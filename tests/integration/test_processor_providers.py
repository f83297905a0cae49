"""Providers other than Claude, chat rooms, and the environment a CLI gets, each through a processor run.

The codex provider runs a small stand-in ``codex`` program (a real executable printing ``codex exec --json``
JSONL events); the command provider runs argv templates. No shell is involved anywhere.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.chat.sessions import get_session
from tests.processor_support import agent_script, command_agent, count, make_home, open_home, run_idle

pytestmark = pytest.mark.integration

FAKE_CODEX = """#!{python}
import json, os, sys, uuid
prompt = sys.stdin.read() if sys.argv[-1] == "-" else sys.argv[-1]
with open(os.environ["CODEX_ARGV_LOG"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "prompt": prompt, "sandbox": os.environ.get("IS_SANDBOX")}}) + "\\n")
args = sys.argv[1:]
thread = args[args.index("resume") + 1] if "resume" in args else str(uuid.uuid4())
print(json.dumps({{"type": "thread.started", "thread_id": thread}}))
print(json.dumps({{"type": "turn.started"}}))
if "crash" in prompt:
    print(json.dumps({{"type": "turn.failed", "error": {{"message": "model exploded"}}}}))
    sys.exit(1)
print(json.dumps({{"type": "item.completed", "item": {{"id": "i0", "type": "reasoning", "text": "thinking"}}}}))
print(json.dumps({{"type": "item.completed", "item": {{"id": "i1", "type": "agent_message", "text": "codex says hi"}}}}))
print(json.dumps({{"type": "turn.completed", "usage": {{"input_tokens": 1, "output_tokens": 1}}}}))
"""


def _fake_codex(tmp_path: Path) -> Path:
    path = tmp_path / "codex"
    path.write_text(FAKE_CODEX.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_codex_provider_replies_and_resumes_its_thread(tmp_path: Path, sqlite_url: str) -> None:
    _fake_codex(tmp_path)
    argv_log = tmp_path / "codex.log"
    home = make_home(
        tmp_path,
        sqlite_url,
        {
            "cx": {
                "provider": "codex",
                "model": "gpt-test",
                "system_prompt": "Be kind.",
                "session_scope": "agent",
            }
        },
    )
    env = {"PATH": f"{tmp_path}:{os.environ.get('PATH', '')}", "CODEX_ARGV_LOG": str(argv_log)}
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "-v first message")
        run_idle(rt, env=env)
        thread = get_session(rt.db, "cx")
        assert thread
        rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "second")
        rt.queue.intake.enqueue_message(ChatAddress("api", "me", conversation="other"), "please crash")
        run_idle(rt, env=env)
        replies = [
            r["message"]
            for r in rt.db.read("SELECT message FROM responses ORDER BY id")
            if "trying again" not in r["message"]
        ]
        assert replies == ["codex says hi", "codex says hi"]
        failed = rt.db.read("SELECT last_error FROM messages WHERE status = 'pending'")
        assert len(failed) == 1 and "model exploded" in failed[0]["last_error"]
    calls = [json.loads(line) for line in argv_log.read_text().splitlines()]
    first, second = calls[0], calls[1]
    assert first["argv"][:3] == ["exec", "--json", "--skip-git-repo-check"] and first["argv"][-1] == "-"
    assert "--model" in first["argv"] and "gpt-test" in first["argv"] and "resume" not in first["argv"]
    assert first["prompt"].startswith("<instructions>\nBe kind.") and first["prompt"].endswith(
        "-v first message"
    )
    assert (
        second["argv"][second["argv"].index("resume") + 1] == first["argv"][-1] or "resume" in second["argv"]
    )


def test_command_template_placeholders_and_environment(tmp_path: Path, sqlite_url: str) -> None:
    out = tmp_path / "seen.json"
    script = tmp_path / "show.py"
    script.write_text(
        "import json, os, sys\n"
        "seen = {'argv': sys.argv[1:], 'cwd': os.getcwd(), 'agent': os.environ['AGENTPOST_AGENT'],\n"
        "        'sandbox': os.environ.get('IS_SANDBOX'), 'extra': os.environ.get('EXTRA')}\n"
        "json.dump(seen, open(sys.argv[1], 'w'))\n"
        "print('ok')\n"
    )
    agent = {
        "provider": "command",
        "command": [
            sys.executable,
            str(script),
            str(out),
            "{agent}",
            "{workspace}",
            "{prompt}",
            "{{literal}}",
        ],
        "permission_mode": "bypassPermissions",
        "env": {"EXTRA": "from-settings"},
    }
    home = make_home(tmp_path, sqlite_url, {"bot": agent})
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(ChatAddress("cli", "me"), "--help; rm -rf /")
        run_idle(rt, env={"PATH": os.environ.get("PATH", "")})
        assert [r["message"] for r in rt.db.read("SELECT message FROM responses")] == ["ok"]
        workspace = str(rt.settings.workspace("bot"))
    seen = json.loads(out.read_text())
    assert seen["argv"][1:] == ["bot", workspace, "--help; rm -rf /", "{literal}"]  # one argv item, no shell
    assert seen["cwd"] == workspace and seen["agent"] == "bot" and seen["extra"] == "from-settings"
    assert seen["sandbox"] == ("1" if os.geteuid() == 0 else None)


def test_chat_room_post_reaches_every_other_member_and_is_stored(tmp_path: Path, sqlite_url: str) -> None:
    # The "announcer" replies with a chat-room post; the others (scripted CLI) just answer.
    script = agent_script(tmp_path)
    announcer = {
        "provider": "command",
        "command": [sys.executable, "-c", "print('Posting. [#crew: standup in 5]')"],
    }
    home = make_home(
        tmp_path,
        sqlite_url,
        {
            "lead": announcer,
            "m1": command_agent(script),
            "m2": command_agent(script),
            "loner": command_agent(script),
        },
        teams={"crew": {"agents": ["lead", "m1", "m2"], "leader": "lead"}},
    )
    env = {"PATH": os.environ.get("PATH", ""), "AGENT_LOG": str(tmp_path / "runs.log")}
    with open_home(home) as rt:
        rt.queue.intake.enqueue_message(
            ChatAddress("web", "ann", sender_id="u1", conversation="w1"), "@crew announce it"
        )
        run_idle(rt, env=env)
        posts = rt.db.read("SELECT team_id, from_agent, message FROM chat_messages")
        assert [dict(p) for p in posts] == [
            {"team_id": "crew", "from_agent": "lead", "message": "standup in 5"}
        ]
        chat = rt.db.read(
            "SELECT agent, hops, status, message_id FROM messages WHERE channel = 'chat' ORDER BY agent"
        )
        assert [(c["agent"], c["hops"], c["status"]) for c in chat] == [
            ("m1", 1, "completed"),
            ("m2", 1, "completed"),
        ]
        assert all(c["message_id"].startswith("chat_") for c in chat)
        responses = rt.db.read("SELECT message, channel, conversation FROM responses ORDER BY id")
        assert responses[0]["message"] == "Posting. → #crew: standup in 5"
        assert len(responses) == 3 and {r["channel"] for r in responses} == {
            "web"
        }  # members' answers reach the user
        assert count(rt, "SELECT COUNT(*) FROM messages WHERE agent = 'loner'") == 0
