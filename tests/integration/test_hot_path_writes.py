"""Write transactions on the hot path: a one-chunk Telegram reply, from the platform update to the ack.

The Telegram adapter and a running processor (the scripted agent) share this process and one database; every
committed write transaction of the process is recorded with the code that opened it
(``Database.observe_writes``). The budget is at most 6 for the whole path: the message taken in, the run
claimed, started and finished, the reply claimed, and its one chunk recorded as sent with the ack.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio.from_thread
import pytest

from adapters.telegram import TelegramChannel
from shared.runtime import Runtime
from tests.channel_support import HoldingTelegram, RunningChannel, channel_home, count, open_home, wait_for
from workers.processor import Processor

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

TELEGRAM = {"telegram": {"allowlist": ["42"], "poll_timeout_seconds": 1, "typing": False}}
MAX_WRITES = 6


class WriteLog:
    """Every committed write transaction of this process: where it was opened (our frames, innermost last)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writes: list[str] = []
        self.last = time.monotonic()

    def __call__(self) -> None:
        ours = [
            f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.name}"
            for f in traceback.extract_stack()
            if any(part in f.filename for part in ("/shared/", "/workers/", "/adapters/"))
            and not f.filename.endswith(("/shared/storage/db.py", "/shared/aio.py"))
        ]
        with self.lock:
            self.writes.append(" > ".join(ours[-3:]))
            self.last = time.monotonic()

    def quiet_for(self, seconds: float) -> bool:
        with self.lock:
            return time.monotonic() - self.last >= seconds

    def since(self, mark: int) -> list[str]:
        with self.lock:
            return self.writes[mark:]


@contextmanager
def running_processor(rt: Runtime) -> Iterator[Processor]:
    """A processor serving in its own event loop (a thread), stopped at the end like a real one."""
    processor = Processor(rt)
    with anyio.from_thread.start_blocking_portal() as portal:
        done = portal.start_task_soon(processor.serve)
        try:
            yield processor
        finally:
            portal.call(processor.stop)
            done.result(timeout=20)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldingTelegram]:
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    with HoldingTelegram() as server:
        yield server


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    home = channel_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", TELEGRAM, queue={"debounce_ms": 0})
    runtime = open_home(home)
    yield runtime
    runtime.close()


def test_a_one_chunk_reply_takes_at_most_six_write_transactions(rt: Runtime, fake: HoldingTelegram) -> None:
    log = WriteLog()
    stop = rt.db.observe_writes(log)
    channel = TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url})
    try:
        with RunningChannel(channel), running_processor(rt):
            # A first message and reply warm everything up (the chat's first-contact records, caches).
            fake.push_text(42, "hello")
            wait_for(lambda: len(fake.texts(42)) == 1, 15, "the first reply")
            wait_for(lambda: log.quiet_for(1.5), 15, "the processes to settle")
            mark = len(log.writes)

            update = fake.push_text(42, "one more")
            fake.wait_for_offset(update["update_id"] + 1, 10)
            wait_for(lambda: len(fake.texts(42)) == 2, 15, "the second reply")
            wait_for(
                lambda: count(rt, "SELECT COUNT(*) FROM responses WHERE status = 'acked'") == 2, 10, "the ack"
            )
            wait_for(lambda: log.quiet_for(1.5), 15, "the processes to settle")
            writes = log.since(mark)
    finally:
        stop()
    assert fake.texts(42)[1] == "alpha got: one more"
    listing = "\n".join(f"  {i + 1}. {w}" for i, w in enumerate(writes))
    print(f"{len(writes)} write transactions for one reply:\n{listing}")
    assert len(writes) <= MAX_WRITES, f"{len(writes)} write transactions for one reply:\n{listing}"
