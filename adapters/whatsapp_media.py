"""WhatsApp messages with media, taken in after the webhook was answered (a part of :mod:`adapters.whatsapp`).

A webhook must be answered quickly, and a file is fetched from the Graph API in two requests that may be
slow or fail. So a message with media from a sender whose files are fetched is stored as a durable job
(:mod:`shared.chat.inbound_jobs`, keyed by its wamid) when the webhook takes it in, and :meth:`MediaJobs.run`
fetches the files in the background and hands each message to the runner with its file. A download that
keeps failing (``media_attempts``, each within ``media_timeout_seconds``) is told to the user, and their
message is still passed on without the file. A job outlives a restart of the adapter; a redelivered webhook
of a message already taken in stores nothing (:mod:`shared.chat.dedupe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from adapters.platform import HandleOutcome, Inbound, Platform
from adapters.whatsapp_graph import as_dict
from shared.aio import call
from shared.chat import dedupe, inbound_jobs
from shared.settings.channels import WhatsAppSettings

#: Fetches a job's file and saves it: ``download(sender, wamid, media, kind)`` returns the saved path.
Download = Callable[[str, str, dict[str, Any], str], Awaitable[Path]]
#: What the channel does once a message is taken in (its read receipt), given how it was handled.
TakenIn = Callable[[Inbound, HandleOutcome], None]


class MediaJobs:
    """The stored media jobs of the WhatsApp channel, and the background task that finishes them.

    Given the channel (its database, name, log and :attr:`~adapters.platform.Platform.inbox`), its settings,
    how to fetch a file from the Graph API, and what to do once a message is taken in."""

    def __init__(
        self, channel: Platform, config: WhatsAppSettings, *, download: Download, taken_in: TakenIn
    ) -> None:
        self.channel = channel
        self.config = config
        self.download = download
        self.taken_in = taken_in
        self.log = channel.log
        #: Set when a job is stored, so :meth:`run` fetches it now rather than at its next poll.
        self.wake = asyncio.Event()

    async def store(self, inbound: Inbound, media: dict[str, Any]) -> None:
        """Keep ``inbound``'s media as a job (committed before the webhook is answered) for :meth:`run`."""
        channel = self.channel
        job = {
            "conversation": inbound.conversation,
            "sender": inbound.sender,
            "text": inbound.text,
            "wamid": inbound.external_id,
            "kind": inbound.metadata.get("type", ""),
            "media": media,
            "attempts": 0,
        }
        wamid = inbound.external_id
        if await call(dedupe.is_seen, channel.rt.db, channel.name, wamid):
            return  # a redelivery of a message already taken in
        await call(inbound_jobs.save, channel.rt.db, channel.name, wamid, json.dumps(job))
        self.wake.set()

    async def run(self) -> None:
        """Fetch the files of stored media jobs and queue their messages, until the channel stops."""
        channel = self.channel
        stop = channel.inbox.stop_event
        while not stop.is_set():
            self.wake.clear()
            try:
                jobs = await call(inbound_jobs.pending, channel.rt.db, channel.name)
                for key, text in jobs:
                    if stop.is_set():
                        return
                    await self._finish(key, text)
            except Exception:
                self.log.exception("media jobs failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.config.media_poll_seconds)

    async def _finish(self, key: str, text: str) -> None:
        """One job: fetch its file and hand its message in; or count a failed attempt (the job stays for the
        next round), or after the last attempt pass the message on without the file."""
        channel = self.channel
        db = channel.rt.db
        try:
            job = json.loads(text)
            media = as_dict(job.get("media"))
            inbound = Inbound(
                conversation=str(job["conversation"]),
                sender_id=str(job["conversation"]),
                sender=str(job.get("sender") or job["conversation"]),
                text=str(job.get("text") or ""),
                external_id=key,
                metadata={"wamid": key, "type": str(job.get("kind") or "")},
            )
        except (ValueError, KeyError, TypeError) as exc:
            self.log.error("dropped an unreadable media job %s: %s", key, exc)
            await call(inbound_jobs.finish, db, channel.name, key)
            return
        kind = str(job.get("kind") or "file")
        try:
            path = await asyncio.wait_for(
                self.download(inbound.sender_id, key, media, kind), self.config.media_timeout_seconds
            )
        except Exception as exc:
            attempts = int(job.get("attempts") or 0) + 1
            reason = "it took too long" if isinstance(exc, TimeoutError) else str(exc) or type(exc).__name__
            self.log.warning("downloading the %s of %s failed (attempt %s): %s", kind, key, attempts, reason)
            if attempts < self.config.media_attempts:
                job["attempts"] = attempts
                await call(inbound_jobs.update, db, channel.name, key, json.dumps(job))
                await asyncio.sleep(min(5.0, 0.5 * 2**attempts))
                return
            await self._failed(inbound, media, kind)
        else:
            self.taken_in(inbound, await channel.inbox.handle(replace(inbound, files=[path])))
        await call(inbound_jobs.finish, db, channel.name, key)

    async def _failed(self, inbound: Inbound, media: dict[str, Any], kind: str) -> None:
        """The file could not be fetched: tell the user, and still pass their message on (without it)."""
        channel = self.channel
        name = str(media.get("filename") or f"a {kind}")
        note = f"(The user sent {name}, but it could not be downloaded.)"
        text = f"{inbound.text}\n{note}" if inbound.text else note
        if await call(dedupe.is_seen, channel.rt.db, channel.name, inbound.external_id):
            return
        await call(
            channel.inbox.reply,
            inbound,
            f"I could not fetch the file you sent ({name}). I passed your message on without it; "
            "please send the file again if it matters.",
            kind="media_failed",
        )
        self.taken_in(inbound, await channel.inbox.handle(replace(inbound, text=text)))
