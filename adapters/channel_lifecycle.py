"""The lifecycle part of the channel runner (:mod:`adapters.runner`): the platform's connect, receive and
disconnect (:class:`adapters.platform.Platform`); tries again with a doubling wait while the platform cannot be
reached; the state recorded for ``agentpost status`` and ``doctor``; the run of the receive, delivery,
typing and pairing loops until a signal stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING

from shared.aio import call
from shared.backoff import Backoff
from shared.chat import health
from shared.clock import now_ms

if TYPE_CHECKING:
    from adapters.delivery import Delivery
    from adapters.intake import Intake
    from adapters.platform import Platform


class Lifecycle:
    """Connecting, running and stopping one channel (a part of :class:`adapters.runner.ChannelRunner`).

    Given the platform (connect, receive, disconnect), the intake (its pairing loop), the delivery (its
    delivery and typing loops), the runner's worker id (recorded with the connection state) and its stop
    event (set by a signal, or when one loop ends)."""

    def __init__(
        self,
        platform: Platform,
        intake: Intake,
        delivery: Delivery,
        *,
        worker: str,
        stop_event: asyncio.Event,
    ) -> None:
        self.platform = platform
        self.intake = intake
        self.delivery = delivery
        self.rt = platform.rt
        self.name = platform.name
        self.config = platform.config
        self.log = platform.log
        self.worker = worker
        self.stop_event = stop_event
        #: How often the connected adapter writes its state again: its heartbeat (``/metrics``).
        self.heartbeat_seconds = health.REFRESH_MS / 1000

    # -- running ---------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Connect, then receive, deliver and show typing until :attr:`stop_event` is set; then close."""
        try:
            if not await self.open_with_retries():
                return
            tasks = [
                asyncio.create_task(self.platform.receive(), name=f"{self.name}-receive"),
                asyncio.create_task(self.delivery.loop(), name=f"{self.name}-deliver"),
                asyncio.create_task(self.intake.voice.run(), name=f"{self.name}-voice"),
            ]
            if self.config.typing:
                tasks.append(asyncio.create_task(self.delivery.typing_loop(), name=f"{self.name}-typing"))
            if self.delivery.previews.enabled:
                tasks.append(asyncio.create_task(self.delivery.previews.loop(), name=f"{self.name}-previews"))
            if self.config.pairing:
                tasks.append(asyncio.create_task(self.intake.pairing_loop(), name=f"{self.name}-pairing"))
            tasks.append(asyncio.create_task(self._heartbeat(), name=f"{self.name}-heartbeat"))
            stopper = asyncio.create_task(self.stop_event.wait())
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            self.stop_event.set()
            failed = [t for t in done if t is not stopper and not t.cancelled() and t.exception()]
            # Let an in-flight part finish (the loops check stop_event between parts), then cancel.
            _, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
            for task in pending:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            stopper.cancel()
            if failed:
                error = failed[0].exception()
                await self._health("stopped", error=f"{type(error).__name__}: {error}")
                raise error  # type: ignore[misc]
            await self._health("stopped")
        finally:
            with contextlib.suppress(Exception):
                await self.platform.close()

    async def _health(
        self, state: health.State, *, error: str = "", attempts: int = 0, next_try_at: int = 0
    ) -> None:
        """Record the connection state (best effort: a busy database must not stop the adapter)."""
        try:
            await call(
                health.report,
                self.rt.db,
                self.name,
                state,
                worker=self.worker,
                error=error,
                attempts=attempts,
                next_try_at=next_try_at,
            )
        except Exception as exc:
            self.log.info("could not record the %s state %s: %s", self.name, state, exc)

    async def _heartbeat(self) -> None:
        """While connected, write the ``up`` state again every :attr:`heartbeat_seconds` (its ``since``
        stays): the row's time tells ``/metrics`` the adapter is alive."""
        while not self.stop_event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), self.heartbeat_seconds)
            if not self.stop_event.is_set():
                await self._health("up")

    async def open_with_retries(self) -> bool:
        """:meth:`open`; while the platform is unreachable, try again with a doubling wait, recording each
        failure for ``agentpost status`` and ``doctor``. A refusal is raised at once. Returns False when
        stopped before a connection was made."""
        backoff = Backoff(self.config.start_retry_base_seconds, self.config.start_retry_max_seconds)
        wait, attempts = backoff.delay(1), 0
        await self._health("connecting")
        while True:
            try:
                await self.platform.open()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if not self.platform.is_unreachable(exc) or self.stop_event.is_set():
                    await self._health("stopped", error=error)
                    raise
                attempts += 1
                self.log.warning(
                    "cannot reach %s (try %s): %s; trying again in %.1f s",
                    self.platform.platform_label or self.name,
                    attempts,
                    error,
                    wait,
                )
                await self._health(
                    "retrying", error=error, attempts=attempts, next_try_at=now_ms() + int(wait * 1000)
                )
                with contextlib.suppress(Exception):
                    await self.platform.close()  # a fresh client for the next try
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), wait)
                if self.stop_event.is_set():  # stopped while waiting: a clean stop, not a failure
                    await self._health("stopped", error=error)
                    return False
                wait = backoff.delay(attempts + 1)
                continue
            await self._health("up")
            if attempts:
                self.log.info("%s is reachable again; connected", self.platform.platform_label or self.name)
            return True

    async def serve_with_signals(self) -> None:
        """:meth:`run` until SIGTERM or SIGINT."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        self.log.info("%s adapter %s started", self.name, self.worker)
        await self.run()
        self.log.info("%s adapter %s stopped", self.name, self.worker)
