"""Crash accounting under the ``steer`` busy policy (workers/steer.py), with real processes: ``kill -9`` of
the processor while a message steered into a running claude run is on its way — claimed into the run but
not yet taken in by the CLI, or taken in and being answered — must lose nothing and answer nothing twice.

The real ``agentpost run processor`` runs the real claude CLI against a fake API whose replies stream for
about 1.3 s and name the messages they answer. Each round sends message A to one chat, waits until A's
request reached the fake (the CLI is alive under the processor), sends B to the same chat, and then, by
round: kills the processor as soon as B is claimed into the run; kills it once B's own request reached the
fake; or lets the run finish (B answered by A's run). A killed processor is restarted at once; the crashed
run's messages are run again together, as under ``collect``.

At the end, per message: completed, dead, covered by more than one final reply, lost, and finals that do
not name every message they answer. Wanted: all completed, 0 dead, 0 duplicate finals, 0 lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import Runtime
from tests.crash_support import (
    LabelledApi,
    ProcessorProcess,
    cli_pids,
    label,
    message_rows,
    processor_env,
    tally,
    write_home,
)
from tests.fault_support import fresh_pg_database
from tests.fixtures import cli_installed  # noqa: F401  (fixtures)
from tests.liveness_support import process_gone
from tests.probes import wait_for
from tests.processor_support import open_home

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

#: What each round does once B is on its way (cycled).
MOMENTS = ("kill when B is claimed", "kill when B reached the API", "no kill")
ROUNDS = 6


@pytest.fixture
def api() -> Iterator[LabelledApi]:
    with LabelledApi() as fake:
        yield fake


def _send(rt: Runtime, chat: int, number: int) -> str:
    address = ChatAddress(
        "telegram", f"user{chat}", sender_id=str(7000 + chat), conversation=str(7000 + chat)
    )
    sent = rt.queue.intake.enqueue_message(address, f"{label(chat, number)} please answer this")
    return sent.message_id


def _steered_into_a_run(rt: Runtime, message_id: str) -> bool:
    rows = rt.db.read("SELECT payload FROM events WHERE type = 'message_claimed'")
    return any(
        p.get("steered") and message_id in p["message_ids"] for p in (json.loads(r["payload"]) for r in rows)
    )


def _reached_api(api: LabelledApi, lbl: str) -> bool:
    return any(lbl in call.labels for call in api.calls())


def _scenario(tmp_path: Path, api: LabelledApi, db_url: str) -> None:
    home = write_home(tmp_path, db_url, ("assistant",), processor={"busy_policy": "steer"})
    env = processor_env(api, tmp_path, home)
    procs: list[ProcessorProcess] = []

    def start() -> ProcessorProcess:
        procs.append(ProcessorProcess(env, tmp_path / f"processor-{len(procs)}.log"))
        return procs[-1]

    kills: list[str] = []
    rt = open_home(home)
    try:
        proc = start()
        for round_no in range(ROUNDS):
            moment = MOMENTS[round_no % len(MOMENTS)]
            chat = round_no  # a chat per round: no message is interrupted twice
            a_label, b_label = label(chat, 0), label(chat, 1)
            _send(rt, chat, 0)
            wait_for(
                lambda a=a_label, p=proc: _reached_api(api, a) and cli_pids(p.pid), 30, f"{a_label}'s run"
            )
            b_id = _send(rt, chat, 1)
            if moment == "no kill":
                wait_for(lambda b=b_id: _steered_into_a_run(rt, b), 30, f"{b_label} steered")
                continue
            if moment == "kill when B is claimed":
                wait_for(lambda b=b_id: _steered_into_a_run(rt, b), 30, f"{b_label} steered")
            else:
                wait_for(lambda b=b_label: _reached_api(api, b), 30, f"{b_label}'s request")
            cli = cli_pids(proc.pid)
            rows = message_rows(rt.db)
            proc.kill9()
            assert rows[a_label]["status"] == rows[b_label]["status"] == "processing", rows
            assert cli, f"round {round_no}: no CLI under the processor at the kill"
            # The run's CLI dies with the processor.
            wait_for(lambda c=cli: all(process_gone(pid) for pid in c), 10, f"the CLI {cli} to die")
            kills.append(f"round {round_no}: {moment}, CLI {cli}")
            proc = start()
        expected = 2 * ROUNDS
        wait_for(
            lambda: [r["status"] for r in message_rows(rt.db).values()].count("completed") == expected,
            120,
            "every message answered",
        )
        proc.stop()
        result = tally(rt.db, api)
        claims = rt.db.read("SELECT payload FROM events WHERE type = 'message_claimed'")
        steered = [p for p in (json.loads(r["payload"]) for r in claims) if p.get("steered")]
    finally:
        for p in procs:
            if p.alive():
                p.kill9()
        rt.close()
    print(f"[steer {db_url.split(':')[0]}] kills={len(kills)} steered_claims={len(steered)} {result.line()}")
    assert len(kills) == 4, kills
    assert len(steered) >= ROUNDS  # every round's B went into a running run (a re-run may steer again)
    assert (result.total, result.completed, result.dead, result.duplicate_finals, result.lost) == (
        2 * ROUNDS,
        2 * ROUNDS,
        0,
        0,
        0,
    ), (result.line(), result.details)
    assert result.mismatched_finals == 0, result.details["mismatched"]


def test_sqlite_processor_killed_with_steered_messages_loses_nothing(
    tmp_path: Path, api: LabelledApi
) -> None:
    _scenario(tmp_path, api, f"sqlite:///{tmp_path / 'agentpost.db'}")


@pytest.mark.postgres
def test_postgres_processor_killed_with_steered_messages_loses_nothing(
    tmp_path: Path, api: LabelledApi
) -> None:
    with fresh_pg_database() as url:
        _scenario(tmp_path, api, url)
