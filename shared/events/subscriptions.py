"""In-process subscribers of a log other processes write too: :class:`LocalSubscriptions`, shared by the SQL
and Redis drivers."""

from __future__ import annotations

import abc
import threading

from shared.events.entries import CursorExpired, EventEntry, Handler


class _Subscription:
    """One in-process subscriber: its filter, handler and position, guarded so that the background follower
    and an ``append`` in this process never deliver an event twice."""

    def __init__(self, topic: str | None, handler: Handler, position: int) -> None:
        self.topic = topic
        self.handler = handler
        self.position = position
        self.lock = threading.RLock()
        self.stopped = threading.Event()


class LocalSubscriptions(abc.ABC):
    """Subscriptions of this process to a log that other processes write too. ``append`` delivers to them
    before it returns (seed 001: a subscriber has an event once its append returned); a background follower
    per subscription delivers what other processes append."""

    PAGE = 500

    def _local_subs(self) -> list[_Subscription]:
        subs: list[_Subscription] | None = getattr(self, "_subs_list", None)
        if subs is None:
            subs = []
            self._subs_list = subs
        return subs

    @abc.abstractmethod
    def read(self, topic: str | None, after: str | None = None, limit: int = 100) -> list[EventEntry]:
        """The log's own read (the follower pages through it)."""

    def _add_subscription(self, topic: str | None, handler: Handler, position: int) -> _Subscription:
        sub = _Subscription(topic, handler, position)
        self._local_subs().append(sub)
        return sub

    def _drop_subscription(self, sub: _Subscription) -> None:
        sub.stopped.set()
        subs = self._local_subs()
        if sub in subs:
            subs.remove(sub)

    def _pump(self, sub: _Subscription) -> int:
        """Deliver what ``sub`` has not seen yet (one page); returns how many events were read."""
        with sub.lock:
            if sub.stopped.is_set():
                return 0
            try:
                batch = self.read(sub.topic, str(sub.position), self.PAGE)
            except CursorExpired as exc:
                sub.position = int(exc.retained_after)
                batch = self.read(sub.topic, str(sub.position), self.PAGE)
            for entry in batch:
                if sub.stopped.is_set():
                    break
                cursor = int(entry.cursor)
                if cursor <= sub.position:
                    continue  # delivered by a nested append of the handler itself
                sub.position = cursor
                sub.handler(entry)
            return len(batch)

    def _deliver_local(self) -> None:
        """Bring every subscription of this process up to date (called after an append committed)."""
        for sub in list(self._local_subs()):
            while self._pump(sub) >= self.PAGE:
                pass
