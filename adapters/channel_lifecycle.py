"""The connection lifecycle of :class:`adapters.base.Channel` (a mixin): the platform's connect, receive
and disconnect, which plugins override; tries again with a doubling wait while the platform cannot be
reached; the state recorded for ``agentpost status`` and ``doctor``; the run of the receive, delivery,
typing and pairing loops until a signal stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from adapters.delivery import Delivery
from shared.aio import call
from shared.backoff import Backoff
from shared.chat import health
from shared.clock import now_ms


class ChannelLifecycle(Delivery):
    """Connecting, running and stopping a channel (the base class builds on it)."""

    # -- platform half (override) ----------------------------------------------------------------------------
    async def open(self) -> None:
        """Connect to the platform (log in); called before delivery starts."""

    async def close(self) -> None:
        """Disconnect; called once at the end, also after a failed :meth:`open`."""

    async def receive(self) -> None:
        """Receive inbound messages until :attr:`stop_event` is set, calling :meth:`handle` for each."""
        await self.stop_event.wait()

    async def run_until_stopped(self, task: asyncio.Task[None], what: str) -> None:
        """:meth:`receive` for a plugin whose platform client or server runs as ``task``: wait until
        :attr:`stop_event` is set (``task`` is left to :meth:`close`), or until ``task`` ends — then raise
        why it ended, or a ``RuntimeError`` saying ``what`` stopped."""
        stop = asyncio.create_task(self.stop_event.wait())
        done, _ = await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if task in done:
            task.result()
            raise RuntimeError(f"{what} stopped")

    #: Takes back held messages of senders approved since they wrote (:meth:`adapters.base.Channel.pairing_loop`).
    pairing_loop: Callable[[], Coroutine[Any, Any, None]]

    # -- running ---------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Connect, then receive, deliver and show typing until :attr:`stop_event` is set; then close."""
        try:
            if not await self.open_with_retries():
                return
            tasks = [
                asyncio.create_task(self.receive(), name=f"{self.name}-receive"),
                asyncio.create_task(self.delivery_loop(), name=f"{self.name}-deliver"),
            ]
            if self.config.typing:
                tasks.append(asyncio.create_task(self.typing_loop(), name=f"{self.name}-typing"))
            if self.config.pairing:
                tasks.append(asyncio.create_task(self.pairing_loop(), name=f"{self.name}-pairing"))
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
                await self.close()

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

    def is_unreachable(self, exc: BaseException) -> bool:
        """Whether a failure to :meth:`open` means the platform cannot be reached now (worth retrying), as
        opposed to a refusal such as a bad token. Plugins add their library's network errors."""
        # Not every OSError: a webhook port that is taken will not free itself by waiting.
        return isinstance(exc, ConnectionError | TimeoutError | socket.gaierror)

    async def open_with_retries(self) -> bool:
        """:meth:`open`; while the platform is unreachable, try again with a doubling wait, recording each
        failure for ``agentpost status`` and ``doctor``. A refusal is raised at once. Returns False when
        stopped before a connection was made."""
        backoff = Backoff(self.config.start_retry_base_seconds, self.config.start_retry_max_seconds)
        wait, attempts = backoff.delay(1), 0
        await self._health("connecting")
        while True:
            try:
                await self.open()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if not self.is_unreachable(exc) or self.stop_event.is_set():
                    await self._health("stopped", error=error)
                    raise
                attempts += 1
                self.log.warning(
                    "cannot reach %s (try %s): %s; trying again in %.1f s",
                    self.platform_label or self.name,
                    attempts,
                    error,
                    wait,
                )
                await self._health(
                    "retrying", error=error, attempts=attempts, next_try_at=now_ms() + int(wait * 1000)
                )
                with contextlib.suppress(Exception):
                    await self.close()  # a fresh client for the next try
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), wait)
                if self.stop_event.is_set():  # stopped while waiting: a clean stop, not a failure
                    await self._health("stopped", error=error)
                    return False
                wait = backoff.delay(attempts + 1)
                continue
            await self._health("up")
            if attempts:
                self.log.info("%s is reachable again; connected", self.platform_label or self.name)
            return True

    async def serve_with_signals(self) -> None:
        """:meth:`run` until SIGTERM or SIGINT."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        self.log.info("%s adapter %s started", self.name, self.worker)
        await self.run()
        self.log.info("%s adapter %s stopped", self.name, self.worker)
