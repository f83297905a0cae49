"""Agent leases: one run at a time per agent. A processor holds an agent's lease while it runs that agent's
messages (taken with the claim, renewed while the run goes on) and gives it up when the agent has nothing
more; a lease whose holder died is taken back by recovery. Part of :class:`shared.queue.core.Queue`.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.clock import now_ms
from shared.queue.records import QueueState
from shared.queue.records import sql_in as _in
from shared.storage.db import Tx


class LeaseOps(QueueState):
    """Taking, renewing and giving up agent leases."""

    def _take_agent(self, tx: Tx, agent: str, worker: str, now: int, lease: int) -> bool:
        # The row is written (rowcount 1) exactly when the worker now holds the agent: a new row, or the
        # update whose WHERE found the agent free, expired or already this worker's.
        taken = tx.execute(
            "INSERT INTO agent_leases (agent, holder, lease_until, acquired_at, paused_until, stop_requested, note) "
            "VALUES (:agent, :worker, :lease, :now, 0, '', '') ON CONFLICT (agent) DO UPDATE SET "
            "holder = excluded.holder, lease_until = excluded.lease_until, acquired_at = CASE WHEN "
            "agent_leases.holder = excluded.holder THEN agent_leases.acquired_at ELSE excluded.acquired_at END "
            "WHERE agent_leases.paused_until <= :now AND (agent_leases.holder IS NULL OR "
            "agent_leases.holder = excluded.holder OR agent_leases.lease_until < :now)",
            {"agent": agent, "worker": worker, "lease": lease, "now": now},
        ).rowcount
        return taken == 1

    @staticmethod
    def _release_agent(tx: Tx, agent: str, worker: str) -> None:
        tx.execute(
            "UPDATE agent_leases SET holder = NULL, lease_until = 0 WHERE agent = :agent AND holder = :worker",
            {"agent": agent, "worker": worker},
        )

    def release_agent(self, agent: str, worker: str) -> None:
        """Give up the agent lease (after the worker's last group of that agent is done)."""
        with self.db.transaction() as tx:
            self._release_agent(tx, agent, worker)

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
                    "UPDATE messages SET lease_until = :lease WHERE status = 'processing' AND claimed_by = :worker "
                    f"AND message_id IN {clause}",
                    {"lease": lease, "worker": worker, **params},
                ).rowcount
            if agent is not None:
                tx.execute(
                    "UPDATE agent_leases SET lease_until = :lease WHERE agent = :agent AND holder = :worker",
                    {"lease": lease, "agent": agent, "worker": worker},
                )
        return held

    def _release_if_idle(self, tx: Tx, agent: str, worker: str, now: int) -> bool:
        """Give up the agent lease when this worker holds no other message of the agent and none waits."""
        # Two probes, each on its partial index (pending; processing): one query with OR would scan the table,
        # and the table keeps every completed message for a day.
        waiting = tx.scalar(
            "SELECT 1 FROM messages WHERE status = 'pending' AND agent = :agent AND available_at <= :now LIMIT 1",
            {"agent": agent, "now": now},
        )
        if waiting is not None:
            return False
        holding = tx.scalar(
            "SELECT 1 FROM messages WHERE status = 'processing' AND claimed_by = :worker AND agent = :agent "
            "LIMIT 1",
            {"agent": agent, "worker": worker},
        )
        if holding is not None:
            return False
        self._release_agent(tx, agent, worker)
        return True
