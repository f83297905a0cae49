"""The processor keeps an outcome the database refused and writes it again, but never over another worker's
claim: when the leases lapsed while the server was away and another processor took the messages over and
answered them, the kept completion is fenced off (``LeaseLost``) once the server answers again, so the chat
gets one reply, not two.

Real parts: a PostgreSQL database, the processor in this process reaching it through a TCP relay the test
shuts and opens (tests.integration.test_storage_faults.Relay), a second processor straight on the server,
and the agent a script run by the ``command`` provider. The first processor's worker id names another host,
so recovery may take its claims back as soon as their leases lapse, as it would for a processor elsewhere.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import anyio
import psycopg
import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime, open_runtime
from tests.channel_support import Proc
from tests.fault_support import fault_home, started_runs
from tests.integration.test_storage_faults import Relay
from tests.probes import wait_for
from workers.processor import Processor

pytestmark = [pytest.mark.integration, pytest.mark.postgres, pytest.mark.timeout(90)]


def test_a_kept_completion_is_fenced_off_when_another_worker_took_the_messages_over(
    tmp_path: Path, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agentpost.processor")
    relay = Relay(("127.0.0.1", 5432))
    relay.open()
    name = pg_url.rpartition("/")[2]
    home = fault_home(
        tmp_path,
        f"postgresql://postgres@127.0.0.1:{relay.port}/{name}",
        {},
        queue={"lease_seconds": 1.0},
        processor={"recover_interval_seconds": 0.3, "progress_note_seconds": 0},
    )
    away = open_runtime(home, env={"PATH": os.environ.get("PATH", "")})
    direct = open_runtime(home, env={"PATH": os.environ.get("PATH", ""), "AGENTPOST_DATABASE_URL": pg_url})
    elsewhere = Processor(away, worker_id="elsewhere:4242:1")
    mid = direct.queue.intake.enqueue_message(
        ChatAddress("api", "u", conversation="c"), "token-once sleepfirst=2"
    ).message_id
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            anyio.run(lambda: elsewhere.run_until_idle(timeout=60))
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    first = threading.Thread(target=serve)
    try:
        first.start()
        wait_for(lambda: started_runs(tmp_path, mid), 20, "the first processor's run to start")
        relay.close()  # the server is away for the first processor from here on
        # Its leases lapse; recovery (here, on the second processor's side) takes the message back, and
        # the second processor answers it.
        wait_for(
            lambda: direct.queue.failures.recover_stale_messages().retried == [mid],
            10,
            "the lapsed claim taken back",
        )
        anyio.run(lambda: Processor(direct).run_until_idle(timeout=30))
        assert direct.queue.admin.get_message(mid).status == "completed"  # type: ignore[union-attr]
        wait_for(lambda: "kept, trying again" in caplog.text, 10, "the first run's outcome kept")
        relay.open()
        first.join(30)
        assert not first.is_alive() and not failures, failures
    finally:
        relay.close()
        first.join(5)
        away.close()
    try:
        finals = [
            r
            for r in direct.db.read(
                "SELECT message, metadata FROM responses WHERE message_id = :m", {"m": mid}
            )
            if json.loads(r["metadata"]).get("kind") == "final"
        ]
        assert [r["message"] for r in finals] == ["alpha answered token-once"], finals
        assert len(started_runs(tmp_path, mid)) == 2  # run twice (at least once), answered once
        assert elsewhere.stats.completed == 0 and elsewhere.stats.lease_lost == 1, elsewhere.stats
    finally:
        direct.close()


#: Holds a claim's COMMIT (a deferred trigger waits for an advisory lock the test holds), so the test can
#: cut the processor's connection while the claim is being committed: the server commits it, the processor
#: never hears so.
_HOLD_CLAIM_COMMIT = """
CREATE OR REPLACE FUNCTION agentpost_test_hold_commit() RETURNS trigger AS $$
BEGIN
  PERFORM pg_advisory_xact_lock_shared(7401);
  RETURN NULL;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS agentpost_test_hold_claim_commit ON messages;
CREATE CONSTRAINT TRIGGER agentpost_test_hold_claim_commit AFTER UPDATE ON messages
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
  WHEN (OLD.status = 'pending' AND NEW.status = 'processing') EXECUTE FUNCTION agentpost_test_hold_commit();
"""


@pytest.mark.e2e
def test_a_claim_committed_while_the_connection_dropped_is_taken_back_within_seconds(
    tmp_path: Path, pg_url: str
) -> None:
    relay = Relay(("127.0.0.1", 5432))
    relay.open()
    name = pg_url.rpartition("/")[2]
    home = fault_home(
        tmp_path,
        f"postgresql://postgres@127.0.0.1:{relay.port}/{name}",
        {},
        processor={"recover_interval_seconds": 0.5, "progress_note_seconds": 0},
    )
    direct = open_runtime(home, env={"PATH": os.environ.get("PATH", ""), "AGENTPOST_DATABASE_URL": pg_url})
    admin = psycopg.connect(pg_url, autocommit=True)
    admin.execute(_HOLD_CLAIM_COMMIT.encode())
    admin.execute("SELECT pg_advisory_lock(7401)")
    processor = Proc("processor", home, {}, tmp_path / "processor.log")
    held = True
    try:
        mid = direct.queue.intake.enqueue_message(
            ChatAddress("api", "u", conversation="c"), "token-stranded"
        ).message_id
        wait_for(lambda: _waiting_on(admin, 7401), 20, "the processor's claim to wait in its commit")
        relay.close()  # the processor loses its connection in the middle of committing the claim
        admin.execute("SELECT pg_advisory_unlock(7401)")
        held = False
        wait_for(lambda: _status(direct, mid) == "processing", 10, "the server to commit the claim")
        relay.open()
        back = time.monotonic()
        # The processor holds a claim it never heard of: no lease expiry or dead holder would return it
        # (before: it stayed 'processing' for the 600 s stall ceiling).
        wait_for(
            lambda: _status(direct, mid) == "completed", 10, f"the stranded claim run\n{processor.output()}"
        )
        assert time.monotonic() - back < 10
        finals = [
            r["message"]
            for r in direct.db.read(
                "SELECT message, metadata FROM responses WHERE message_id = :m", {"m": mid}
            )
            if json.loads(r["metadata"]).get("kind") == "final"
        ]
        assert finals == ["alpha answered token-stranded"], finals
        assert len(started_runs(tmp_path, mid)) == 1
        assert "took back 1 claim(s) of this processor that no run held" in processor.output()
    finally:
        if held:
            admin.execute("SELECT pg_advisory_unlock(7401)")
        processor.stop()
        relay.close()
        admin.close()
        direct.close()


def _waiting_on(conn: psycopg.Connection[tuple[object, ...]], key: int) -> bool:
    row = conn.execute(
        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND ((classid::bigint << 32) | objid::bigint) = %s",
        (key,),
    ).fetchone()
    return bool(row and row[0])


def _status(rt: Runtime, message_id: str) -> str:
    found = rt.queue.admin.get_message(message_id)
    return found.status if found is not None else "missing"
