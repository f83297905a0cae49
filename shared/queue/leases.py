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
from shared.storage.queries import agent_leases as q
from shared.storage.queries import messages as mq


class AgentLeases:
    """Taking, renewing and giving up agent leases (and renewing the leases of the messages a run holds)."""

    def __init__(self, db: Database, config: QueueSettings) -> None:
        self.db = db
        self.config = config

    def take_in(self, tx: Tx, agent: str, worker: str, now: int, lease: int) -> bool:
        """Take the agent's lease for ``worker`` when it is free, expired or already the worker's; False
        (changing nothing) when it is held, paused, or (PostgreSQL) being changed by another transaction
        right now: a claimer skips that agent instead of waiting for the other transaction only to find
        the agent taken."""
        values = {"agent": agent, "worker": worker, "lease": lease, "now": now}
        if tx.execute(q.TAKE_LEASE, values).rowcount == 1:
            return True
        return tx.execute(q.TAKE_NEW_LEASE, values).rowcount == 1

    @staticmethod
    def release_in(tx: Tx, agent: str, worker: str) -> None:
        """Give up ``worker``'s lease of ``agent`` inside ``tx`` (nothing when another worker holds it)."""
        tx.execute(q.RELEASE, {"agent": agent, "worker": worker})

    def release_agent(self, agent: str, worker: str) -> None:
        """Give up the agent lease (after the worker's last group of that agent is done)."""
        if self.db.dialect.single_statement_writes:  # one round trip instead of three
            self.db.write_statement(q.RELEASE, {"agent": agent, "worker": worker}, set())
            return
        with self.db.transaction() as tx:
            self.release_in(tx, agent, worker)

    def agent_holder(self, agent: str) -> str | None:
        """The worker holding the agent's lease now, if any."""
        row = self.db.read(q.HOLDER, {"a": agent})
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
                _, params = _in("m", list(message_ids))
                held = tx.execute(
                    mq.renew_held(len(message_ids)), {"lease": lease, "worker": worker, **params}
                ).rowcount
            if agent is not None:
                tx.execute(q.RENEW, {"lease": lease, "agent": agent, "worker": worker})
        return held

    def release_if_idle_in(self, tx: Tx, agent: str, worker: str, now: int) -> bool:
        """Give up the agent lease when this worker holds no other message of the agent and none waits."""
        released = tx.execute(q.RELEASE_IF_IDLE, {"agent": agent, "worker": worker, "now": now}).rowcount
        return released == 1
