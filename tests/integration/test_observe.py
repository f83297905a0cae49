"""workers.observe: an event or run record the database refuses is logged and dropped, never raised into the
run it describes — over a real SQLite file that another connection holds locked for writing.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import anyio
import pytest

from shared.chat.address import ChatAddress
from shared.events.log import PendingEvent
from shared.reads.conversation_status import clear_run, record_run
from shared.storage import kv
from shared.storage.dialect import sqlite_path
from shared.storage.kv import Scope
from tests.homes import build_home, open_home
from tests.processor_support import event_types
from workers.observe import quietly, record_event, record_events

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_writes_refused_by_a_locked_database_are_logged_not_raised(
    tmp_path: Path, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentpost.processor")
    database = {"url": sqlite_url, "busy_timeout_ms": 50}
    home = build_home(tmp_path, sqlite_url, {}, extra={"database": database})
    with open_home(home) as rt:
        record_run(
            rt.db,
            "solo",
            run_id="run_x",
            worker="here:1:1",
            chat=ChatAddress("api", conversation="c"),
            message_ids=["m1"],
            started_at=1,
        )
        holder = sqlite3.connect(sqlite_path(sqlite_url), timeout=0.1, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # every other writer is refused until this ends

            async def observe_while_locked() -> None:
                await record_event(rt.events, "queue", "refused_one", {"n": 1})
                await record_events(rt.events, [PendingEvent("refused_many", {"n": 2}, None, topic="queue")])
                await quietly(clear_run, rt.db, "solo", "run_x")

            anyio.run(observe_while_locked)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert "could not append event refused_one" in caplog.text
        assert "could not append 1 events" in caplog.text
        assert "could not update the run record" in caplog.text
        assert not {"refused_one", "refused_many"} & set(event_types(rt))

        assert kv.get(rt.db, Scope.AGENT_RUN, "solo") is not None  # the refused removal did not happen

        anyio.run(record_event, rt.events, "queue", "written", {"n": 3})  # the database answers again
        anyio.run(quietly, clear_run, rt.db, "solo", "run_x")
        assert "written" in event_types(rt) and kv.get(rt.db, Scope.AGENT_RUN, "solo") is None
