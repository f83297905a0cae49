"""Steering a running agent through the database: pauses (rate limits), stop requests and the arrivals that
interrupt a run.

Other processes never signal the processor directly; they write here, and the processor reads the row of
``agent_leases`` it already renews. A pause keeps the agent from being claimed until ``paused_until``.
"""

from __future__ import annotations

from typing import Any

from shared.chat.address import ChatAddress
from shared.chat.lookups import busy_agents
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.storage.db import Database
from shared.storage.queries import agent_leases as q


class Control:
    """Pause, resume and stop operations: the part ``Queue.control``."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def pause_agent(self, agent: str, until_ms: int, reason: str) -> None:
        """Keep ``agent`` from being claimed until ``until_ms`` (a rate limit, say). Never shortens a pause."""
        now = now_ms()
        with self.db.transaction() as tx:
            tx.execute(q.ENSURE_ROW, {"agent": agent})
            tx.execute(q.PAUSE, {"agent": agent, "until": until_ms, "reason": reason[:500]})
            append_events(
                tx,
                [
                    PendingEvent(
                        "agent_paused", {"agent": agent, "until": until_ms, "reason": reason}, topic="agents"
                    )
                ],
                now,
            )
            tx.signal("messages")

    def resume_agent(self, agent: str) -> None:
        """End a pause now."""
        now = now_ms()
        with self.db.transaction() as tx:
            tx.execute(q.RESUME, {"agent": agent})
            append_events(tx, [PendingEvent("agent_resumed", {"agent": agent}, topic="agents")], now)
            tx.signal("messages")

    def agent_state(self, agent: str) -> dict[str, Any]:
        """The agent's lease row: holder, lease_until, paused_until, stop_requested, note (zeros when none)."""
        rows = self.db.read(q.ROW, {"a": agent})
        if not rows:
            return {
                "agent": agent,
                "holder": None,
                "lease_until": 0,
                "acquired_at": 0,
                "paused_until": 0,
                "stop_requested": "",
                "note": "",
            }
        return dict(rows[0])

    def request_stop(self, agent: str, conversation: str = "*") -> None:
        """Ask the processor running ``agent`` to stop the run of ``conversation`` (``*``: any run)."""
        now = now_ms()
        with self.db.transaction() as tx:
            tx.execute(q.ENSURE_ROW, {"agent": agent})
            tx.execute(q.REQUEST_STOP, {"agent": agent, "c": conversation or "*"})
            append_events(
                tx,
                [
                    PendingEvent(
                        "stop_requested", {"agent": agent, "conversation": conversation}, topic="agents"
                    )
                ],
                now,
            )
            tx.signal("control")

    def stop_chat(self, chat: ChatAddress) -> list[str]:
        """``/stop`` in ``chat`` (a chat command, the dashboard's Stop button, ``agentpost chat``): a stop
        request for every agent with a message of the chat pending or processing, which stops its run for
        the chat or, not started yet, the chat's waiting messages. Returns the agents asked (none: nothing
        was written, since a request left behind would stop the chat's *next* run)."""
        agents = busy_agents(self.db, chat)
        for agent in agents:
            self.request_stop(agent, chat.label)  # the chat as the processor's run names it
        return agents

    def take_stop_request(self, agent: str, worker: str) -> str:
        """Read and clear a stop request for the worker holding ``agent``; ``""`` when there is none.

        The processor calls this on every tick of a run, so it first looks with a plain read: only when a
        request is there does it open a write transaction (which on SQLite takes the write lock)."""
        probe = self.db.read_scalar(q.STOP_REQUEST_OF_HOLDER, {"agent": agent, "worker": worker})
        if not probe:
            return ""
        with self.db.transaction() as tx:
            row = tx.one(q.STOP_REQUEST_OF_HOLDER_LOCKED, {"agent": agent, "worker": worker})
            if row is None:
                return ""
            tx.execute(q.CLEAR_STOP_REQUEST, {"agent": agent})
        return str(row["stop_requested"])

    def chat_has_arrival(self, agent: str, chat: ChatAddress, now: int | None = None) -> bool:
        """Whether a message for ``agent`` in ``chat`` (by the chat key the queue groups by) waits, available
        by ``now``: under the ``interrupt`` busy policy it stops the chat's run. Read-only."""
        found = self.db.read_scalar(
            q.ARRIVAL_IN_CHAT,
            {"a": agent, "c": chat.channel, "conv": chat.chat, "now": now_ms() if now is None else now},
        )
        return found is not None

    def waiting_arrivals(self, agent: str, limit: int = 200) -> list[tuple[str, ChatAddress]]:
        """Messages for ``agent`` that wait for the first time (no retry), oldest first, as (message id,
        chat): while the agent runs, they wait behind that run, and their chats are told so once. Read-only."""
        rows = self.db.read(q.FIRST_WAITING, {"a": agent, "n": limit})
        return [(str(r["message_id"]), ChatAddress.of(r)) for r in rows]
