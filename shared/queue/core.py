"""The durable queue: every queue operation implemented once for SQLite and PostgreSQL (TinyAGI's queue API
names, in snake_case), in parts over one :class:`~shared.storage.db.Database`.

Messages move ``pending → processing → completed | dead``; responses ``pending → delivering → acked``.
Each operation is one transaction that also appends the events reporting it and signals waiting processes.
Workers hold leases (renewed while they run), and every write a worker makes is fenced by
``claimed_by``: a worker whose lease expired and whose messages were taken over cannot complete them twice.

The parts (each a plain class; what one needs of another is passed to its constructor):

- ``intake`` (:class:`~shared.queue.enqueue.Intake`): messages into the queue;
- ``leases`` (:class:`~shared.queue.leases.AgentLeases`): agent leases, and renewing a run's leases;
- ``responses`` (:class:`~shared.queue.delivery.Responses`): the outbox — replies queued, claimed per
  channel, delivered, retried, acked or failed;
- ``messages`` (:class:`~shared.queue.messages.Messages`): claims, completions, a run's start;
- ``failures`` (:class:`~shared.queue.failures.Failures`): failed groups, dead workers' claims taken back;
- ``admin`` (:class:`~shared.queue.admin.Admin`): dead letters, views and pruning for operators;
- ``control`` (:class:`~shared.queue.control.Control`): pauses, stop requests, arrivals that interrupt.
"""

from __future__ import annotations

from shared.queue.admin import Admin
from shared.queue.control import Control
from shared.queue.delivery import Responses
from shared.queue.enqueue import Intake, UnknownMention
from shared.queue.failures import Failures, retry_edit_key
from shared.queue.leases import AgentLeases
from shared.queue.messages import Messages
from shared.queue.records import (
    INTERNAL_CHANNELS,
    AgentTurn,
    ChatPost,
    CompleteOutcome,
    Directory,
    EnqueueResult,
    FailOutcome,
    InvalidInput,
    LeaseLost,
    MessageDraft,
    NotFound,
    QueuedMessage,
    QueuedResponse,
    QueueError,
    ResponseDraft,
    RetryBudgetExhausted,
    TxWork,
    group_by_conversation,
)
from shared.settings.model import QueueSettings, Settings
from shared.storage.db import Database

__all__ = [
    "INTERNAL_CHANNELS",
    "AgentTurn",
    "ChatPost",
    "CompleteOutcome",
    "Directory",
    "EnqueueResult",
    "FailOutcome",
    "InvalidInput",
    "LeaseLost",
    "MessageDraft",
    "NotFound",
    "Queue",
    "QueueError",
    "QueuedMessage",
    "QueuedResponse",
    "ResponseDraft",
    "RetryBudgetExhausted",
    "TxWork",
    "UnknownMention",
    "group_by_conversation",
    "retry_edit_key",
]


class Queue:
    """The queue's parts over one :class:`~shared.storage.db.Database`, tuned by ``[queue]`` in the settings
    (``config``) and routing by ``directory``."""

    def __init__(
        self, db: Database, config: QueueSettings | None = None, directory: Directory | None = None
    ) -> None:
        self.db = db
        self.config = config or QueueSettings()
        self.directory = directory or Directory.single("assistant")
        self.intake = Intake(db, self.directory)
        self.leases = AgentLeases(db, self.config)
        self.responses = Responses(db, self.config)
        self.messages = Messages(db, self.config, self.intake, self.leases, self.responses)
        self.failures = Failures(db, self.config, self.responses)
        self.admin = Admin(db, self.config, self.directory)
        self.control = Control(db)

    def follow(self, settings: Settings) -> None:
        """Route and tune by edited settings from now on, in every part (the database stays)."""
        fresh = Queue.from_settings(settings, self.db)
        self.config, self.directory = fresh.config, fresh.directory
        self.intake.directory = self.admin.directory = fresh.directory
        for part in (self.leases, self.responses, self.messages, self.failures, self.admin):
            part.config = fresh.config

    @classmethod
    def from_settings(cls, settings: Settings, db: Database) -> Queue:
        """The queue the settings describe: their ``[queue]`` tuning and their agents and teams."""
        directory = Directory(
            agents=frozenset(settings.agents),
            teams=dict(settings.teams),
            default_agent=settings.queue.default_agent,
        )
        return cls(db, settings.queue, directory)
