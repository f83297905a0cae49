"""SQLite's WAL checkpoints run in the background (shared.storage.wal_checkpoint), not inside a caller's commit.

What a checkpoint did is read from the wal-index (the ``-shm`` file, a shared memory mapping every
connection of the file uses): its header counts the frames in the log (``mxFrame``) and the checkpoint
info after it counts those already copied into the database (``nBackfill``); both are native-endian
32-bit integers at fixed offsets (SQLite's documented WAL-index format). Reading the file takes no lock
and checkpoints nothing itself.
"""

from __future__ import annotations

import logging
import struct
import time
from pathlib import Path

import pytest

from shared.storage.db import WAL_CHECKPOINT_PAGES
from shared.storage.dialect import sqlite_path
from shared.storage.schema import open_database
from shared.storage.wal_checkpoint import Checkpointer, checkpoint

pytestmark = pytest.mark.integration

#: wal-index header: mxFrame at byte 16 (of the first of two header copies); checkpoint info at byte 96,
#: nBackfill first.
_MX_FRAME, _N_BACKFILL = 16, 96


def _frames(path: Path) -> tuple[int, int]:
    """(frames in the log, frames copied into the database) as the wal-index says now."""
    shm = Path(f"{path}-shm").read_bytes()
    (mx_frame,) = struct.unpack_from("=I", shm, _MX_FRAME)
    (backfilled,) = struct.unpack_from("=I", shm, _N_BACKFILL)
    return mx_frame, backfilled


def _write_rows(url: str, rows: int) -> None:
    db = open_database(url)
    path = Path(sqlite_path(url))
    try:
        with db.transaction() as tx:
            for i in range(rows):
                tx.execute(
                    "INSERT INTO kv (scope, key, value, updated_at) VALUES ('test.wal', :k, :v, 0)",
                    {"k": f"k{i}", "v": "x" * 2000},
                )
        # Held open, so no connection's close checkpoints the file in our place.
        mx_frame, _ = _frames(path)
        assert 0 < mx_frame < WAL_CHECKPOINT_PAGES  # below the connections' own automatic checkpoint
        deadline = time.monotonic() + 10
        while _frames(path)[1] < mx_frame:
            assert time.monotonic() < deadline, f"log not checkpointed (frames, copied): {_frames(path)}"
            time.sleep(0.01)
    finally:
        db.close()


def test_a_commit_is_checkpointed_by_the_background_thread_soon_after(sqlite_url: str) -> None:
    # 300 rows of 2 KB: a few hundred pages in the log, far below the automatic checkpoint's 4,000, so only
    # the background checkpointer can have copied them into the database.
    _write_rows(sqlite_url, 300)


def test_run_pending_checkpoints_each_written_file_once(tmp_path: Path) -> None:
    # The background thread's step, driven directly: files written since the last round are checkpointed,
    # then nothing is due until the next write.
    db = open_database(f"sqlite:///{tmp_path / 'a.db'}")
    try:
        with db.transaction() as tx:
            tx.execute("INSERT INTO kv (scope, key, value, updated_at) VALUES ('test.wal', 'k', 'v', 0)")
        path = str(tmp_path / "a.db")
        mine = Checkpointer(background=False)
        mine.wrote(path)
        mine.wrote(path)
        assert mine.run_pending() == 1
        assert mine.run_pending() == 0
        mx_frame, backfilled = _frames(tmp_path / "a.db")
        assert backfilled == mx_frame > 0
    finally:
        db.close()


def test_a_checkpoint_of_a_removed_file_does_nothing(tmp_path: Path) -> None:
    gone = tmp_path / "gone.db"
    assert checkpoint(str(gone)) == 0
    assert not gone.exists()  # never created by the checkpointer


def test_a_read_only_file_is_not_opened_by_the_checkpointer(
    read_only_view: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    # A read-only connection would leave this process's -shm mapping read-only (see
    # shared.storage.errors.refuse_unwritable): the checkpointer skips such a file instead of opening it.
    writable, view = read_only_view
    db = open_database(f"sqlite:///{writable / 'q.db'}")
    try:
        with db.transaction() as tx:
            tx.execute("INSERT INTO kv (scope, key, value, updated_at) VALUES ('test.wal', 'k', 'v', 0)")
        with caplog.at_level(logging.DEBUG, logger="agentpost.db"):
            assert checkpoint(str(view / "q.db")) == 0  # the same file, seen through a read-only mount
        # Refused before any connection was opened (an opened one would fail later, at the write).
        assert [r.getMessage() for r in caplog.records] == [
            f"no WAL checkpoint of {view / 'q.db'}: [Errno 13] not writable by this process: '{view / 'q.db'}'"
        ]
        assert checkpoint(str(writable / "q.db")) == 1
    finally:
        db.close()
