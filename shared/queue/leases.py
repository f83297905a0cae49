"""Agent leases: one run at a time per agent. A processor holds an agent's lease while it runs that agent's
messages (taken with the claim, renewed while the run goes on) and gives it up when the agent has nothing
more; a lease whose holder died is taken back by recovery. The part ``Queue.leases``; the claim and the
completion (:mod:`shared.queue.messages`) take and give up the agent lease inside their own transactions
through the ``*_in`` methods.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.clock import now_ms
from shared.queue.records import sql_in as _in
from shared.settings.model import QueueSettings
from shared.storage.db import Database, Tx
from shared.storage.statuses import MessageStatus


class AgentLeases:
    """Taking, renewing and giving up agent leases (and renewing the leases of the messages a run holds)."""

    def __init__(self, db: Database, config: QueueSettings) -> None:
        self.db = db
        self.config = config
        self._take = take_lease_sql(db.dialect.skip_locked)
        self._take_new = take_new_lease_sql()

    def take_in(self, tx: Tx, agent: str, worker: str, now: int, lease: int) -> bool:
        """Take the agent's lease for ``worker`` when it is free, expired or already the worker's; False
        (changing nothing) when it is held, paused, or (PostgreSQL) being changed by another transaction
        right now: a claimer skips that agent instead of waiting for the other transaction only to find
        the agent taken."""
        values = {"agent": agent, "worker": worker, "lease": lease, "now": now}
        if tx.execute(self._take, values).rowcount == 1:
            return True
        return tx.execute(self._take_new, values).rowcount == 1

    @staticmethod
    def release_in(tx: Tx, agent: str, worker: str) -> None:
        """Give up ``worker``'s lease of ``agent`` inside ``tx`` (nothing when another worker holds it)."""
        tx.execute(_RELEASE, {"agent": agent, "worker": worker})

    def release_agent(self, agent: str, worker: str) -> None:
        """Give up the agent lease (after the worker's last group of that agent is done)."""
        if self.db.dialect.single_statement_writes:  # one round trip instead of three
            self.db.write_statement(_RELEASE, {"agent": agent, "worker": worker}, set())
            return
        with self.db.transaction() as tx:
            self.release_in(tx, agent, worker)

    def agent_holder(self, agent: str) -> str | None:
        """The worker holding the agent's lease now, if any."""
        row = self.db.read("SELECT holder, lease_until FROM agent_leases WHERE agent = :a", {"a": agent})
        if not row or row[0]["holder"] is None or int(row[0]["lease_until"]) < now_ms():
            return None
        return str(row[0]["holder"])

    def renew_leases(
        self,
        worker: str,
        message_ids: Sequence[str],
        *,
        agent: str | None = None,
        lease_ms: int | None = None,
    ) -> int:
        """Extend the leases of messages (and the agent) a live worker is still running.

        Returns how many messages are still held; fewer than asked means the worker lost some.
        """
        now = now_ms()
        lease = now + (lease_ms or self.config.lease_ms)
        held = 0
        with self.db.transaction() as tx:
            if message_ids:
                clause, params = _in("m", list(message_ids))
                held = tx.execute(
                    f"UPDATE messages SET lease_until = :lease WHERE status = '{MessageStatus.PROCESSING}' AND claimed_by = :worker "
                    f"AND message_id IN {clause}",
                    {"lease": lease, "worker": worker, **params},
                ).rowcount
            if agent is not None:
                tx.execute(
                    "UPDATE agent_leases SET lease_until = :lease WHERE agent = :agent AND holder = :worker",
                    {"lease": lease, "agent": agent, "worker": worker},
                )
        return held

    def release_if_idle_in(self, tx: Tx, agent: str, worker: str, now: int) -> bool:
        """Give up the agent lease when this worker holds no other message of the agent and none waits."""
        # One statement (a round trip on PostgreSQL, not three). Two probes, each on its partial index
        # (pending; processing): one probe with OR would scan the table, which keeps every completed
        # message for a day.
        released = tx.execute(
            "UPDATE agent_leases SET holder = NULL, lease_until = 0 WHERE agent = :agent AND holder = :worker "
            f"AND NOT EXISTS (SELECT 1 FROM messages WHERE status = '{MessageStatus.PENDING}' AND agent = :agent "
            f"AND available_at <= :now) AND NOT EXISTS (SELECT 1 FROM messages WHERE status = '{MessageStatus.PROCESSING}' "
            "AND claimed_by = :worker AND agent = :agent)",
            {"agent": agent, "worker": worker, "now": now},
        ).rowcount
        return released == 1


_RELEASE = "UPDATE agent_leases SET holder = NULL, lease_until = 0 WHERE agent = :agent AND holder = :worker"


def take_lease_sql(skip_locked: str, condition: str = "") -> str:
    """The UPDATE taking the lease of ``:agent`` for ``:worker`` until ``:lease`` when it is free, expired or
    already the worker's and the agent is not paused (and ``condition`` holds, `` AND …``); ``skip_locked``
    (the dialect's) skips a lease row another transaction is changing instead of waiting for it."""
    return (
        "UPDATE agent_leases SET holder = :worker, lease_until = :lease, acquired_at = CASE WHEN "
        "holder = :worker THEN acquired_at ELSE :now END WHERE agent IN (SELECT agent FROM agent_leases "
        "WHERE agent = :agent AND paused_until <= :now AND (holder IS NULL OR holder = :worker OR "
        f"lease_until < :now){condition}{skip_locked})"
    )


def take_new_lease_sql(condition: str = "") -> str:
    """The INSERT taking the lease of an agent never leased (no row yet; and ``condition`` holds). Inserted
    only when the statement sees no row: an INSERT meeting a row that another transaction is changing would
    wait for it."""
    return (
        "INSERT INTO agent_leases (agent, holder, lease_until, acquired_at, paused_until, stop_requested, "
        "note) SELECT :agent, :worker, :lease, :now, 0, '', '' WHERE NOT EXISTS (SELECT 1 FROM "
        f"agent_leases WHERE agent = :agent){condition} ON CONFLICT (agent) DO NOTHING"
    )
