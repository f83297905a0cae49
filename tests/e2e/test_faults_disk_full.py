"""A full disk under a running processor: the real ``agentpost run processor`` with its home (the SQLite
database) on a 24 MiB ``tmpfs``, filled with a file while a run goes on, then freed.

What a person sees: their messages wait while nothing can be stored, then they are answered in the order
they were sent, within seconds of the space coming back, each exactly once; and a chat whose messages
waited long is told once why. Before: the claimed messages stayed ``processing`` while the processor lived
(600 s, the stall ceiling, or a restart), messages sent after the space came back were answered first, and
nobody was told anything.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.channel_support import Proc
from tests.fault_support import FAULT_AGENT, mounted_tmpfs, started_runs
from tests.homes import build_home, open_home, scripted_agents
from tests.probes import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

QUEUE = {"lease_seconds": 1.5, "poll_interval_seconds": 0.5}
#: A chat hears "still working" after 1 s of a run, and why it waited after 1 s of refused writes.
PROCESSOR = {"recover_interval_seconds": 0.5, "progress_note_seconds": 1}
OUTAGE_SECONDS = 6.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs mounted for this test (root only; skipped elsewhere)."""
    with mounted_tmpfs(tmp_path / "disk", "24m") as mount:
        yield mount


class FullDisk:
    """Another program filling the disk and keeping it full: whatever space frees up (SQLite truncating its
    log, a rolled-back write) is taken again at once, until :meth:`free` deletes the file."""

    def __init__(self, disk: Path) -> None:
        self.path = disk / "filler"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._stop = threading.Event()
        self._top_up()
        self._thread = threading.Thread(target=self._keep_full, daemon=True)
        self._thread.start()

    def _top_up(self) -> None:
        for size in (65536, 4096, 512, 1):
            try:
                while os.write(self._fd, b"\0" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc

    def _keep_full(self) -> None:
        while not self._stop.wait(0.02):
            self._top_up()

    def free(self) -> None:
        self._stop.set()
        self._thread.join(5)
        os.close(self._fd)
        self.path.unlink()


def statuses(rt: Runtime, ids: list[str]) -> list[str]:
    found = {
        r["message_id"]: r["status"]
        for r in rt.db.read("SELECT message_id, status FROM messages ORDER BY id")
    }
    return [found.get(i, "?") for i in ids]


def replies(rt: Runtime, chat: str) -> list[tuple[str, str]]:
    """``(kind, text)`` of every response to ``chat``, in order (a storage note's kind is its notice)."""
    rows = rt.db.read(
        "SELECT message, metadata FROM responses WHERE conversation = :c ORDER BY id", {"c": chat}
    )
    kinds = [json.loads(r["metadata"]) for r in rows]
    return [
        (meta.get("notice", meta.get("kind", "")), str(r["message"]))
        for meta, r in zip(kinds, rows, strict=False)
    ]


def answer_order(rt: Runtime, ids: list[str]) -> list[str]:
    """``ids`` in the order their final replies were written."""
    rows = rt.db.read("SELECT message_id, metadata FROM responses ORDER BY id")
    finals = [r["message_id"] for r in rows if json.loads(r["metadata"]).get("kind") == "final"]
    return [m for m in finals if m in ids]


def test_disk_full_mid_run_then_freed_answers_every_message_in_order_and_tells_who_waited(
    tmp_path: Path, small_disk: Path
) -> None:
    script = tmp_path / "fault_agent.py"  # outside the small disk: the agent's markers need no space there
    script.write_text(FAULT_AGENT, encoding="utf-8")
    home = build_home(small_disk, None, scripted_agents(script, ("alpha",)), queue=QUEUE, processor=PROCESSOR)
    rt = open_home(home)
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    try:
        send = rt.queue.intake.enqueue_message
        # The first chat's run is long enough to fill the disk under it; two more chats wait their turn.
        first = send(ChatAddress("api", "u1", conversation="c1"), "token-one sleep=1.5").message_id
        wait_for(lambda: started_runs(tmp_path, first), 20, "the first run to start")
        waiting = [
            send(ChatAddress("api", "u2", conversation="c2"), "token-two").message_id,
            send(ChatAddress("api", "u3", conversation="c3"), "token-three").message_id,
        ]
        # SQLite reuses space its log file already holds, so a full disk refuses only the writes that must
        # grow it. The log starts empty here, and a reader (as the dashboard or a status command would be)
        # keeps it from being reused: from now on every write needs new space.
        pin = sqlite3.connect(home / "agentpost.db", isolation_level=None)
        pin.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pin.execute("BEGIN")
        pin.execute("SELECT COUNT(*) FROM messages").fetchone()
        full = FullDisk(small_disk)
        wait_for(lambda: "is full" in processor.output(), 20, "the processor to meet the full disk")
        time.sleep(OUTAGE_SECONDS)  # the outage itself: the disk stays full this long
        unanswered = [
            chat
            for chat, state in zip(("c1", "c2", "c3"), statuses(rt, [first, *waiting]), strict=True)
            if state != "completed"
        ]
        # Whichever writes the full disk let through (one that fits in space the log already holds
        # succeeds), something still waits: before this change, everything claimed by then.
        assert unanswered, "nothing was held up by the full disk"
        full.free()
        pin.execute("COMMIT")
        pin.close()
        freed = time.monotonic()
        later = send(ChatAddress("api", "u4", conversation="c4"), "token-four").message_id
        every = [first, *waiting, later]
        wait_for(
            lambda: statuses(rt, every) == ["completed"] * 4,
            15,
            f"every message answered after the space came back (now {statuses(rt, every)})",
        )
        took = time.monotonic() - freed
        assert took < 8, f"answered {took:.1f} s after the space came back"
        assert processor.popen.poll() is None, processor.output()
        # In the order they were sent, each once; the first run was not repeated.
        assert answer_order(rt, every) == every
        assert len(started_runs(tmp_path, first)) == 1
        for chat, token in (("c1", "one"), ("c2", "two"), ("c3", "three"), ("c4", "four")):
            finals = [text for kind, text in replies(rt, chat) if kind == "final"]
            assert finals == [f"alpha answered token-{token}"], (chat, replies(rt, chat))
        # A chat still waiting when the space came back heard why, once, in plain words, before its
        # answer; none heard it twice; the chat that wrote afterwards never waited.
        for chat in ("c1", "c2", "c3", "c4"):
            kinds = [kind for kind, _ in replies(rt, chat)]
            notes = [text for kind, text in replies(rt, chat) if kind == "storage_wait"]
            assert len(notes) == (1 if chat in unanswered else len(notes)) <= (0 if chat == "c4" else 1), (
                chat,
                unanswered,
                replies(rt, chat),
            )
            for note in notes:
                assert "disk was full" in note and "being handled" in note, note
                assert "sqlite" not in note.lower() and "error" not in note.lower(), note
                assert kinds.index("storage_wait") < kinds.index("final"), kinds
    finally:
        processor.stop()
        rt.close()
