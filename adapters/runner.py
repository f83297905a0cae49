"""The one channel runner: a platform (:class:`adapters.platform.Platform`) and the parts every channel shares.

:class:`ChannelRunner` builds its parts with explicit dependencies, each given the platform and what it needs:

- :class:`adapters.chat_commands.ChatCommands` — chat commands and a chat's sticky agent;
- :class:`adapters.intake.Intake` — allowlist and pairing, dedupe, commands, enqueue (the platform's
  :attr:`~adapters.platform.Platform.inbox`);
- :class:`adapters.delivery.Delivery` — claiming replies, chunking, typing, send retries; it holds the
  live previews (:mod:`adapters.previews`) and progress notes (:mod:`adapters.progress_notes`);
- :class:`adapters.channel_lifecycle.Lifecycle` — open with retries, health, the loops, signals.

They talk to other processes only through the database. ``agentpost run <name>`` runs
:func:`run_process` (the ``agentpost.channel_runner`` entry point), given the plugin class.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from pathlib import Path

from adapters.channel_lifecycle import Lifecycle
from adapters.chat_commands import ChatCommands
from adapters.delivery import Delivery
from adapters.intake import Intake
from adapters.platform import Platform
from shared.runtime import open_runtime
from shared.worker_identity import new_worker_id

_WORKER_NAMES_TAKEN: set[str] = set()


def worker_name(channel: str) -> str:
    """The delivery worker id: ``host:pid:start`` (:func:`shared.worker_identity.new_worker_id`), so a
    restarted adapter on this host sees that its predecessor is gone and takes over its replies at once.

    A second adapter of the same channel in one process (tests) gets a random suffix: its id no longer
    parses as a process, so its claims are judged by their lease alone, as before.
    """
    worker = new_worker_id()
    if channel in _WORKER_NAMES_TAKEN:
        return f"{worker}:{secrets.token_hex(3)}"
    _WORKER_NAMES_TAKEN.add(channel)
    return worker


class ChannelRunner:
    """One platform with its intake, chat commands, delivery and lifecycle (see the module docstring)."""

    def __init__(self, platform: Platform, *, worker_id: str | None = None) -> None:
        self.platform = platform
        self.name = platform.name
        #: The delivery worker id (the lease owner of the responses this runner claims).
        self.worker = worker_id or worker_name(platform.name)
        #: Set to stop the channel (a signal, a test): every loop ends, in-flight parts finish first.
        self.stop_event = asyncio.Event()
        poll = platform.config.poll_interval_seconds or platform.settings.queue.poll_interval_seconds
        self.commands = ChatCommands(platform.rt, platform.name, platform.config)
        self.intake = Intake(platform, self.commands, poll_interval=poll, stop_event=self.stop_event)
        self.delivery = Delivery(platform, worker=self.worker, poll_interval=poll, stop_event=self.stop_event)
        self.lifecycle = Lifecycle(
            platform, self.intake, self.delivery, worker=self.worker, stop_event=self.stop_event
        )
        platform.inbox = self.intake

    async def run(self) -> None:
        """Connect, then receive, deliver and show typing until :attr:`stop_event` is set; then close."""
        await self.lifecycle.run()


def run_process(platform_class: type[Platform], home: Path | None = None) -> None:
    """``agentpost run <name>``: open the runtime, check settings and secrets, run until a signal.

    Bad settings or a missing token raise :class:`shared.settings.model.SettingsError` (the CLI prints it,
    exit code 2).
    """
    logging.basicConfig(
        level=os.environ.get("AGENTPOST_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "telegram", "discord", "slack_sdk", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    runtime = open_runtime(home)
    try:
        runner = ChannelRunner(platform_class(runtime))
        try:
            asyncio.run(runner.lifecycle.serve_with_signals())
        except Exception as exc:  # the platform refused us (bad token, unreachable): say so, exit 1
            runner.platform.log.error(
                "%s adapter stopped: %s: %s", platform_class.name, type(exc).__name__, exc
            )
            raise SystemExit(1) from None
    finally:
        runtime.close()
