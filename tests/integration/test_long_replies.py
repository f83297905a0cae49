"""Replies over ``[processor] reply_max_chars``: cut with a note, the whole text attached as ``reply.txt`` from
the chat's upload folder; a reply within it is unchanged. A real processor, real agent processes (a command
agent; the real claude CLI against the fake API, in a warm session), the real database."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from shared.aio import call
from shared.chat.address import ChatAddress
from shared.file_access import MAX_SEND_BYTES, chat_upload_dir, check_send_path, send_roots
from shared.runtime import Runtime
from tests.fakes.anthropic_api import Computed, FakeAnthropic, Text
from tests.fakes.claude_env import claude_env
from tests.fixtures import anthropic_api, cli_installed  # noqa: F401  (fixtures)
from tests.processor_support import make_home, open_home, run_idle
from workers.output_bounds import LINE_KEEP
from workers.processor import Processor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHAT = ChatAddress("telegram", "ann", sender_id="42", conversation="c1")
#: A command agent printing the number of characters its prompt names, then a newline.
PRINT = (
    "import sys; n = int(sys.stdin.read().split()[-1]); sys.stdout.write(('abcdefghij' * (n // 10 + 1))[:n])"
)


def _reply(rt: Runtime, message_id: str) -> dict[str, Any]:
    row = rt.db.read("SELECT message, files FROM responses WHERE message_id = :m", {"m": message_id})[0]
    return {"text": row["message"], "files": json.loads(row["files"] or "[]")}


def _note(chars: int, shown: int) -> str:
    return (
        f"\n\n(The reply was {chars:,} characters; the first {shown:,} are shown and the whole text is "
        "attached as reply.txt.)"
    )


def test_a_reply_up_to_the_limit_is_unchanged_and_a_longer_one_cut_and_attached(
    tmp_path: Path, db_url: str
) -> None:
    agent = {"provider": "command", "command": [sys.executable, "-c", PRINT]}
    home = make_home(tmp_path, db_url, {"printer": agent}, processor={"reply_max_chars": 1000})
    with open_home(home) as rt:
        within = rt.queue.intake.enqueue_message(CHAT, "print 1000")
        run_idle(rt)
        over = rt.queue.intake.enqueue_message(CHAT, "print 1001")
        run_idle(rt)
        large = rt.queue.intake.enqueue_message(CHAT, f"print {LINE_KEEP * 3}")  # one line, past what is held
        run_idle(rt)
        whole = ("abcdefghij" * (LINE_KEEP * 3 // 10 + 1))[: LINE_KEEP * 3]
        assert _reply(rt, within.message_id) == {"text": whole[:1000], "files": []}
        for sent, chars in ((over, 1001), (large, LINE_KEEP * 3)):
            reply = _reply(rt, sent.message_id)
            assert reply["text"] == whole[:1000] + _note(chars, 1000)
            (attached,) = reply["files"]
            path = Path(attached)
            assert path.name == "reply.txt" and path.parent.parent == chat_upload_dir(rt.settings, CHAT)
            assert path.read_text() == whole[:chars]
        cut = rt.db.read("SELECT payload FROM events WHERE type = 'reply_cut' ORDER BY id", {})
        assert [json.loads(c["payload"])["chars"] for c in cut] == [1001, LINE_KEEP * 3]
        assert list((home / "tmp").iterdir()) == []  # the run's own file had no name


def test_a_warm_claude_turn_with_a_reply_past_the_line_bound_then_a_normal_one(
    tmp_path: Path, sqlite_url: str, api: FakeAnthropic
) -> None:
    big = ("Grüße, " * (LINE_KEEP // 3))[: LINE_KEEP + LINE_KEEP // 2]  # its lines are all too long to hold
    api.add_rule("the big one", Text(big))
    api.add_rule(None, Computed(lambda body: "small and whole"))
    home = make_home(
        tmp_path,
        sqlite_url,
        {"coder": {"provider": "claude", "timeout_seconds": 60}},
        processor={"session_idle_seconds": 60},
    )
    user_home = tmp_path / "user-home"
    user_home.mkdir()
    env = claude_env(api.base_url, user_home, max_retries=0)
    with open_home(home) as rt:
        # The chat's upload folder exists from the start (the first reply.txt makes it otherwise, and a run
        # that may read a new folder does not fit the kept process: the second turn would start cold).
        chat_upload_dir(rt.settings, CHAT).mkdir(parents=True)
        processor = Processor(rt, env=env)
        sent: list[str] = []

        async def steps() -> None:
            for text in ("the big one", "and now?"):
                mid = (await call(rt.queue.intake.enqueue_message, CHAT, text)).message_id
                sent.append(mid)
                with anyio.fail_after(60):
                    while not await call(
                        rt.db.read, "SELECT 1 FROM responses WHERE message_id = :m", {"m": mid}
                    ):
                        await anyio.sleep(0.05)

        async def go() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(processor.serve)
                try:
                    await steps()
                finally:
                    processor.stop()

        anyio.run(go)
        first, second = (_reply(rt, m) for m in sent)
        assert (
            processor.warm.reused == 1
        )  # the second turn read the same process's output after the long lines
    assert first["text"] == big[:100_000] + _note(len(big), 100_000)
    assert Path(first["files"][0]).read_text() == big
    assert second == {"text": "small and whole", "files": []}


FAKE_CODEX = """#!{python}
import json, sys
sys.stdin.read()
print(json.dumps({{"type": "thread.started", "thread_id": "thread-1"}}))
print(json.dumps({{"type": "item.completed", "item": {{"type": "agent_message", "text": "a first, short message"}}}}))
text = ("Grüße 😀 " * {n})[:{n}]
print(json.dumps({{"type": "item.completed", "item": {{"type": "agent_message", "text": text}}}}))
print(json.dumps({{"type": "turn.completed", "usage": {{"input_tokens": 1, "output_tokens": 1}}}}))
"""


def test_a_codex_reply_past_the_line_bound_is_cut_and_attached_whole(tmp_path: Path, sqlite_url: str) -> None:
    chars = LINE_KEEP  # escaped by json.dumps (\\u00fc, \\ud83d\\ude00): a line of several MiB
    codex = tmp_path / "codex"
    codex.write_text(FAKE_CODEX.format(python=sys.executable, n=chars))
    codex.chmod(0o755)
    home = make_home(tmp_path, sqlite_url, {"cx": {"provider": "codex"}})
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(CHAT, "write a lot")
        run_idle(rt, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
        reply = _reply(rt, sent.message_id)
        thread = rt.db.read("SELECT session_id FROM sessions", {})
    whole = ("Grüße 😀 " * chars)[:chars]
    assert reply["text"] == whole[:100_000].rstrip() + _note(chars, 100_000)
    assert Path(reply["files"][0]).read_text() == whole
    assert [t["session_id"] for t in thread] == ["thread-1"]


def test_a_reply_past_what_a_reply_may_attach_keeps_what_fits_and_says_so(
    tmp_path: Path, sqlite_url: str
) -> None:
    printed = MAX_SEND_BYTES + 3_000_000
    home = make_home(
        tmp_path, sqlite_url, {"printer": {"provider": "command", "command": [sys.executable, "-c", PRINT]}}
    )
    with open_home(home) as rt:
        sent = rt.queue.intake.enqueue_message(CHAT, f"print {printed}")
        run_idle(rt)
        reply = _reply(rt, sent.message_id)
        path = Path(reply["files"][0])
        roots = send_roots(rt.settings, "printer", CHAT)
        assert check_send_path(str(path), roots) == (str(path), "")  # a channel sends it
    assert reply["text"].endswith(_note(printed, 100_000))
    size = path.stat().st_size
    assert MAX_SEND_BYTES - 2048 < size <= MAX_SEND_BYTES
    with path.open("rb") as f:
        f.seek(size - 200)
        tail = f.read().decode()
    note = tail[tail.index("\n\n[agentpost") :]
    kept = size - len(note)  # ASCII: as many characters as bytes
    assert note == f"\n\n[agentpost: the output went on for {printed - kept:,} more characters, not kept]\n"
