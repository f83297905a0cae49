"""Voice notes: a recording a chat user sends reaches the agent as its words.

A message whose files include a recording (:func:`shared.inbound_media.is_recording`: a Telegram voice note
or audio file, a WhatsApp audio, a Discord voice message) is not queued as it comes in. The intake stores it
as a durable job (:mod:`shared.chat.inbound_jobs`, its own family ``<channel>.voice``), committed with what
acknowledges it to the platform, and :meth:`VoiceNotes.run` sends the recording to the speech-to-text
service the operator named (``[voice]``: any OpenAI-compatible ``POST …/audio/transcriptions``, multipart
``file`` and ``model``, answered ``{"text": …}``). The message is then queued with the words, marked as a
transcript (``[voice note, transcribed: "…"]``) and kept in its metadata
(:data:`shared.inbound_media.TRANSCRIPT_KEY`) and for ``/status`` (:mod:`shared.chat.voice_heard`).

So a slow service never holds up the adapter's receive loop: later messages are taken in meanwhile (they
may be queued before the voice note's words). No service set up, or one that fails (an error status, no
answer within ``timeout_seconds``, no words): the chat is told at once, in plain words, what happened and
what to do, and a caption sent with the recording is still passed on. A job outlives a restart; a
redelivered message is not taken in twice (:mod:`shared.chat.dedupe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import httpx

from adapters.platform import Also, HandleOutcome, Inbound
from shared.aio import call
from shared.chat import dedupe, inbound_jobs, voice_heard
from shared.chat.address import ChatAddress
from shared.inbound_media import TRANSCRIPT_KEY, is_recording, megabytes
from shared.runtime import Runtime
from shared.settings.sections import VoiceSettings
from shared.storage.db import Tx

_T = TypeVar("_T")
#: The service's address: wins over ``[voice] api_url``.
URL_ENV = "AGENTPOST_VOICE_API_URL"
#: The service's key, sent as ``Authorization: Bearer``; a local service may need none.
KEY_ENV = "AGENTPOST_VOICE_API_KEY"
_PATH = "/audio/transcriptions"
_TYPE_BY_SUFFIX = {".ogg": "audio/ogg", ".oga": "audio/ogg", ".opus": "audio/ogg", ".m4a": "audio/mp4"}
_TRY_AGAIN = "Please try again in a minute, or type your message."


class NotHeard(Exception):
    """A recording could not be turned into words; ``str(exc)`` says why, for the person who sent it."""


def transcriptions_url(base: str) -> str:
    """The endpoint for a configured address: a base like ``https://api.openai.com/v1`` gets
    ``/audio/transcriptions``; an address that already ends so is used as it is."""
    base = base.rstrip("/")
    return base if base.endswith(_PATH) else base + _PATH


async def transcribe(path: Path, config: VoiceSettings, url: str, key: str) -> str:
    """The words of the recording at ``path``, from the service at ``url``; :class:`NotHeard` saying why
    not. Bounded by ``config.timeout_seconds`` in all."""
    size = path.stat().st_size
    if size > config.max_mb * 1_000_000:
        raise NotHeard(
            f"it is larger than the speech-to-text service takes ({megabytes(size)}; at most "
            f"{config.max_mb:g} MB). Please send a shorter one, or type your message."
        )
    media_type = _TYPE_BY_SUFFIX.get(path.suffix.lower(), "application/octet-stream")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with httpx.AsyncClient(timeout=config.timeout_seconds) as client:
            answer = await asyncio.wait_for(
                client.post(
                    transcriptions_url(url),
                    data={"model": config.model, "response_format": "json"},
                    files={"file": (path.name, path.read_bytes(), media_type)},
                    headers=headers,
                ),
                config.timeout_seconds,
            )
    except (TimeoutError, httpx.TimeoutException):
        raise NotHeard(
            f"the speech-to-text service did not answer within {config.timeout_seconds:g} s. {_TRY_AGAIN}"
        ) from None
    except httpx.HTTPError:
        raise NotHeard(f"the speech-to-text service could not be reached. {_TRY_AGAIN}") from None
    if answer.status_code in (401, 403):
        raise NotHeard(
            "the speech-to-text service refused agentpost's key. Please type your message; the operator "
            f"can check {KEY_ENV}."
        )
    if answer.status_code >= 400:
        raise NotHeard(
            f"the speech-to-text service answered with an error (HTTP {answer.status_code}). {_TRY_AGAIN}"
        )
    try:
        words = str(answer.json()["text"]).strip()
    except (ValueError, KeyError, TypeError):
        raise NotHeard(f"the speech-to-text service gave an answer I could not read. {_TRY_AGAIN}") from None
    if not words:
        raise NotHeard("no words could be made out in it. Please try again, or type your message.")
    return words


def heard_text(caption: str, words: str) -> str:
    """What the agent is given for a voice note: its caption, if any, and the words, marked as a transcript
    (quotes inside are kept as they are: the marker's quotes are the first and the last)."""
    line = f'[voice note, transcribed: "{words}"]'
    return f"{caption}\n{line}" if caption.strip() else line


class Taker(Protocol):
    """What :class:`VoiceNotes` needs of the intake (:class:`adapters.intake.Intake`)."""

    rt: Runtime
    name: str
    log: logging.Logger
    stop_event: asyncio.Event

    async def until_stored(self, work: Callable[[], Awaitable[_T]], what: str) -> _T: ...

    def handle_sync(self, message: Inbound, *, also: Also | None = None) -> HandleOutcome: ...

    def reply_in(
        self, tx: Tx, address: ChatAddress, text: str, *, kind: str, also: Also | None = None
    ) -> None: ...


class VoiceNotes:
    """The voice notes of one channel's intake (see the module docstring)."""

    def __init__(self, intake: Taker, *, poll_seconds: float) -> None:
        self.intake = intake
        self.jobs = f"{intake.name}.voice"
        self.poll_seconds = poll_seconds
        #: Set when a job is stored, so :meth:`run` takes it now rather than at its next poll.
        self.wake = asyncio.Event()

    @staticmethod
    def wanted(message: Inbound) -> bool:
        """Whether ``message`` carries a recording still to be heard."""
        return TRANSCRIPT_KEY not in message.metadata and any(is_recording(p) for p in message.files)

    def service(self) -> tuple[VoiceSettings, str, str]:
        """The settings in force, the service's address ("" when none is set up) and its key."""
        settings = self.intake.rt.settings
        env = settings.env
        return settings.voice, (env.get(URL_ENV) or settings.voice.api_url).strip(), env.get(KEY_ENV, "")

    async def take_in(self, message: Inbound, also: Also | None) -> HandleOutcome:
        """Store ``message`` as a job (``also`` commits with it) for :meth:`run`, or, with no service set
        up, tell the chat at once. Returns once committed, like :meth:`adapters.intake.Intake.handle`."""
        outcome = await self.intake.until_stored(
            lambda: call(self._store, message, also), f"taking in voice note {message.external_id}"
        )
        self.wake.set()
        return outcome

    def _store(self, message: Inbound, also: Also | None) -> HandleOutcome:
        intake = self.intake
        if dedupe.is_seen(intake.rt.db, intake.name, message.external_id):
            return "duplicate"
        if not self.service()[1]:
            return self._not_heard(
                message,
                "no speech-to-text service is set up here. Please type your message instead (the "
                "operator can turn voice notes on in the [voice] settings).",
                also,
            )
        job = json.dumps({**message.held_record(), "files": [str(p) for p in message.files]})

        def write(tx: Tx) -> None:
            inbound_jobs.save_in(tx, self.jobs, message.external_id, job)
            if also is not None:
                also(tx)

        intake.rt.db.run_transaction(write)
        return "queued"

    async def run(self) -> None:
        """Hear the stored voice notes and queue their words, until the channel stops."""
        intake = self.intake
        while not intake.stop_event.is_set():
            self.wake.clear()
            try:
                for key, job in await call(inbound_jobs.pending, intake.rt.db, self.jobs):
                    if intake.stop_event.is_set():
                        return
                    await self._hear(key, job)
            except Exception:
                intake.log.exception("voice notes failed; retrying")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.poll_seconds)

    async def _hear(self, key: str, job: str) -> None:
        """One stored voice note: its words queued, or the chat told why not; then the job is done."""
        intake = self.intake
        db = intake.rt.db
        try:
            record: dict[str, Any] = json.loads(job)
            message = replace(
                Inbound.from_held(str(record["sender_id"]), record),
                files=[Path(str(p)) for p in record.get("files") or []],
            )
        except (ValueError, KeyError, TypeError) as exc:
            intake.log.error("dropped an unreadable voice note job %s: %s", key, exc)
            await call(inbound_jobs.finish, db, self.jobs, key)
            return
        if not await call(dedupe.is_seen, db, intake.name, message.external_id):
            await self._transcribe(message)
        await call(inbound_jobs.finish, db, self.jobs, key)

    async def _transcribe(self, message: Inbound) -> None:
        intake = self.intake
        config, url, key = self.service()
        recording = next(p for p in message.files if is_recording(p))
        words, why = "", ""
        try:
            if not url:
                raise NotHeard(
                    "no speech-to-text service is set up here any more. Please type your message instead."
                )
            words = await transcribe(recording, config, url, key)
        except NotHeard as exc:
            why = str(exc)
        except OSError as exc:  # the saved recording is gone: nothing to send
            intake.log.warning("voice note %s unreadable: %s", message.external_id, exc)
            why = "its file could not be read. Please send it again."
        if why:
            intake.log.warning("voice note %s not transcribed: %s", message.external_id, why)
            await intake.until_stored(
                lambda: call(self._not_heard, message, why, None), f"answering {message.external_id}"
            )
            return
        intake.log.info("voice note %s transcribed (%d characters)", message.external_id, len(words))
        heard = replace(
            message,
            text=heard_text(message.text, words),
            files=[p for p in message.files if p != recording],
            metadata={**message.metadata, TRANSCRIPT_KEY: words, "voice_file": str(recording)},
        )
        chat = message.conversation

        def keep_words(tx: Tx) -> None:
            voice_heard.remember_in(tx, intake.name, chat, words)

        await intake.until_stored(
            lambda: call(intake.handle_sync, heard, also=keep_words), f"queueing {message.external_id}"
        )

    def _not_heard(self, message: Inbound, why: str, also: Also | None) -> HandleOutcome:
        """Tell the chat the voice note could not be heard and why; a caption sent with it still goes on to
        the agent (without the recording); with none, the message is answered by this note."""
        intake = self.intake
        caption = message.text.strip()
        note = f"I got your voice note but could not turn it into text: {why}"
        address = message.address_on(intake.name)
        external_id = message.external_id

        def tell(tx: Tx) -> None:
            intake.reply_in(tx, address, note, kind="voice_not_heard")
            if not caption:  # answered: the platform id is taken in with the note
                dedupe.remember_in(tx, intake.name, external_id)
                if also is not None:
                    also(tx)

        intake.rt.db.run_transaction(tell)
        if not caption:
            return "command"
        passed = replace(
            message,
            text=f"{caption}\n(The user also sent a voice note, which could not be transcribed.)",
            files=[p for p in message.files if not is_recording(p)],
            metadata={**message.metadata, TRANSCRIPT_KEY: ""},
        )
        return intake.handle_sync(passed, also=also)
