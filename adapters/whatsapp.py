"""The WhatsApp channel over the official Cloud API: signed webhooks in, Graph API calls out.

- The webhook is served by uvicorn at ``/webhook`` on ``WHATSAPP_WEBHOOK_PORT``: the verification GET
  (``hub.verify_token`` compared in constant time) and message POSTs. Every POST's
  ``X-Hub-Signature-256`` is checked over the raw body (HMAC-SHA256 with the app secret, constant-time
  compare) before the body is parsed; a missing or wrong signature is refused with 403 and changes nothing.
- Inbound messages are queued with the wamid as ``external_id``, so Meta's redeliveries are not queued twice
  (also after the message row was pruned: :mod:`shared.chat.dedupe`). The POST is answered 200 once
  every message in it is committed — text at once; a message with media is stored as a durable job
  and its file fetched afterwards by a background task (:mod:`adapters.whatsapp_media`), so a webhook never
  waits on a download, and a failed download is told to the user while their message is still answered
  (passed on without the file). Only a database that cannot commit gets a 503 (Meta retries). A signed
  payload of an unexpected shape is logged and acknowledged with 200: redelivering it would not help.
- Read receipts and typing: a message taken in is marked read (``{"status": "read", "message_id": WAMID}``
  on ``/messages``, with ``"typing_indicator": {"type": "text"}`` when it was queued for an agent), in the
  background so the webhook answer never waits on it; while the chat's message is pending or processing the
  indicator is renewed every ``typing_interval_seconds`` (20 s: WhatsApp shows it for up to 25 s, or until
  the reply arrives) on the chat's newest waiting message. ``read_receipts = false`` turns both off.
- Delivery receipts (``statuses``): a ``failed`` one for a message we sent marks its response failed with
  Meta's reason (the wamid of every sent part is remembered); the user is told when they next write.
- Replies go through ``POST {graph}/{version}/{phone_number_id}/messages`` with backoff on the throughput
  errors 130429 and 131056 (and 429/5xx). A refusal for good (131047: more than 24 h since the user last
  wrote; a file type the Cloud API does not take) marks the reply failed instead of retrying it. Files are
  uploaded to ``/media`` and sent as documents, text files as ``text/plain`` (a long reply goes as ``.txt``).
  WhatsApp cannot edit a sent message, so a run's progress notes are new messages, at most one every
  ``progress_min_interval_seconds`` (see :mod:`adapters.progress_notes`).
- Questions (an agent asking before a tool runs) are interactive messages with reply buttons (Allow, Deny,
  Allow for this chat); a press arrives as an ``interactive`` message whose ``button_reply.id`` is the
  button's data, and is answered through the inbox (only the person asked may answer, at most once).
  WhatsApp cannot edit a message, so the decision comes as a new message (the default
  :meth:`~adapters.platform.Platform.close_question` says it cannot edit), which also tells the one whose
  press decided it; a press that changed nothing ("Only Ann can answer this request.") gets a reply of its
  own. A question longer than a button message takes (1,024 characters: an edit's diff) is sent in full
  as text, its last paragraph ("Allow it? …") then with the buttons; one Meta refuses with buttons is asked
  as text, answered with ``/allow`` or ``/deny``.

Meta's payloads and errors are read by :mod:`adapters.whatsapp_graph` (no I/O there).

Environment: ``WHATSAPP_ACCESS_TOKEN``, ``WHATSAPP_PHONE_NUMBER_ID``, ``WHATSAPP_APP_SECRET``,
``WHATSAPP_VERIFY_TOKEN``, ``WHATSAPP_GRAPH_URL`` (default ``https://graph.facebook.com``),
``WHATSAPP_WEBHOOK_PORT`` (default 8787).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import mimetypes
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from adapters import whatsapp_graph
from adapters.platform import (
    Button,
    ChannelSettings,
    HandleOutcome,
    Inbound,
    Platform,
    SendFailure,
    pause_for_tests_after_fetch,
    run_until_stopped,
    safe_filename,
    upload_folder,
)
from adapters.web.limits import EmbeddedServer, start_webhook_server
from adapters.whatsapp_graph import (
    THROUGHPUT_CODES,
    GraphSendError,
    ParsedMessage,
    as_dict,
    as_int,
    as_list,
    explain,
    parse_messages,
    valid_signature,
    wamid_of,
    webhook_values,
)
from adapters.whatsapp_media import MediaJobs
from shared.aio import call
from shared.backoff import Backoff
from shared.chat.address import ChatAddress
from shared.chat.lookups import newest_waiting_external_id
from shared.settings.channels import WhatsAppSettings
from shared.settings.model import SettingsError

DEFAULT_GRAPH = "https://graph.facebook.com"
#: Meta's webhook payloads are at most a few MB (batched notifications); anything larger is refused unread.
WEBHOOK_MAX_BODY_BYTES = 3 * 1024 * 1024


class WhatsAppChannel(Platform):
    """The WhatsApp Cloud API adapter (``agentpost run whatsapp``)."""

    name: ClassVar[str] = "whatsapp"
    #: Meta redelivers a webhook answered with an error: while the database is away, answer 503 after a
    #: short wait instead of holding the request open (:meth:`adapters.intake.Intake.until_stored`).
    storage_wait_seconds: ClassVar[float | None] = 5.0
    prefix: ClassVar[str] = "whatsapp"
    limit: ClassVar[int] = 4096
    settings_model: ClassVar[type[ChannelSettings]] = WhatsAppSettings
    platform_label: ClassVar[str] = "WhatsApp"
    long_reply_suffix: ClassVar[str] = ".txt"  # text/plain: the Cloud API refuses text/markdown documents

    config: WhatsAppSettings
    http: httpx.AsyncClient | None = None
    #: Background read-receipt calls (kept so they are not garbage-collected mid-flight).
    _receipts: set[asyncio.Task[None]]
    #: wamid -> time.monotonic() of the last typing indicator shown on it.
    _typing_at: dict[str, float]
    server: EmbeddedServer | None = None
    server_task: asyncio.Task[None] | None = None
    #: Messages with media, fetched after the webhook was answered (made in :meth:`open`).
    media: MediaJobs

    def read_secrets(self) -> None:
        self.access_token = self.require_env("WHATSAPP_ACCESS_TOKEN", "a Cloud API access token")
        self.phone_number_id = self.require_env("WHATSAPP_PHONE_NUMBER_ID", "the sending phone number id")
        self.app_secret = self.require_env(
            "WHATSAPP_APP_SECRET", "the app secret (to check webhook signatures)"
        )
        self.verify_token = self.require_env("WHATSAPP_VERIFY_TOKEN", "the webhook verify token")
        self.graph = (self.env.get("WHATSAPP_GRAPH_URL") or self.config.graph_url or DEFAULT_GRAPH).rstrip(
            "/"
        )
        port_text = self.env.get("WHATSAPP_WEBHOOK_PORT")
        try:
            self.port = int(port_text) if port_text else self.config.webhook_port
        except ValueError:
            raise SettingsError(f"WHATSAPP_WEBHOOK_PORT={port_text!r} is not a port number") from None

    @property
    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.access_token}"}

    def _url(self, edge: str) -> str:
        return f"{self.graph}/{self.config.api_version}/{edge}"

    # -- lifecycle -----------------------------------------------------------------------------------------
    def webhook_app(self) -> Starlette:
        """The ASGI app serving ``/webhook``."""
        return Starlette(
            routes=[
                Route("/webhook", self._verify, methods=["GET"]),
                Route("/webhook", self._webhook, methods=["POST"]),
            ]
        )

    async def open(self) -> None:
        self.media = MediaJobs(self, self.config, download=self._download, taken_in=self._taken_in)
        self._receipts = set()
        self._typing_at = {}
        self.http = httpx.AsyncClient(timeout=30.0)
        # Under the web adapter's connection limits; an oversized POST gets 413 before its signature is checked.
        self.server, self.server_task = await start_webhook_server(
            self.webhook_app(),
            self.settings.api,
            host=self.config.webhook_host,
            port=self.port,
            max_body=WEBHOOK_MAX_BODY_BYTES,
            name="whatsapp-webhook",
        )
        self.log.info("WhatsApp webhook listening on %s:%s/webhook", self.config.webhook_host, self.port)

    async def close(self) -> None:
        for task in list(getattr(self, "_receipts", ())):
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, 2)
        if self.server is not None:
            self.server.should_exit = True
        if self.server_task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self.server_task, 5)
        if self.http is not None:
            await self.http.aclose()
        self.server = self.server_task = self.http = None

    async def receive(self) -> None:
        assert self.server_task is not None
        media = asyncio.create_task(self.media.run(), name="whatsapp-media")
        try:
            await run_until_stopped(self.server_task, self.inbox.stop_event, "the webhook server")
        finally:
            media.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await media

    # -- webhook -------------------------------------------------------------------------------------------
    async def _verify(self, request: Request) -> Response:
        params = request.query_params
        token = params.get("hub.verify_token", "")
        if params.get("hub.mode") == "subscribe" and hmac.compare_digest(
            token.encode(), self.verify_token.encode()
        ):
            return PlainTextResponse(params.get("hub.challenge", ""))
        return PlainTextResponse("forbidden", status_code=403)

    async def _webhook(self, request: Request) -> Response:
        body = await request.body()
        if not valid_signature(self.app_secret, body, request.headers.get("x-hub-signature-256")):
            self.log.warning("refused a webhook POST with a bad or missing signature")
            return PlainTextResponse("bad signature", status_code=403)
        try:
            payload = json.loads(body)
            changes = list(webhook_values(payload, self.phone_number_id))
        except Exception as exc:
            # Signed by Meta but not what we understand: redelivering it would not help, so acknowledge.
            self.log.warning("ignored a signed webhook payload of unexpected shape (%s): %.300r", exc, body)
            return PlainTextResponse("ok")
        parsed = [p for value in changes for p in parse_messages(value, self.log)]
        statuses = [s for value in changes for s in as_list(value.get("statuses")) if isinstance(s, dict)]
        if parsed:
            await pause_for_tests_after_fetch(self, f"{len(parsed)} WhatsApp message(s)")
        try:
            for item in parsed:
                await self._accept(item)
            for status in statuses:
                await self._on_status(status)
        except Exception:
            # The database could not commit: not answered, so Meta redelivers (nothing half-done is kept).
            self.log.exception("could not store a webhook's messages; Meta will redeliver")
            return PlainTextResponse("try again", status_code=503, headers={"Retry-After": "5"})
        return PlainTextResponse("ok")

    async def _accept(self, item: ParsedMessage) -> None:
        """Queue a message now, or store its media job (fetched afterwards by :attr:`media`)."""
        inbound = item.inbound
        if item.press is not None:
            told = await self.inbox.press(item.press)
            # A press that decided the request is told by the decision itself, a new message in this chat
            # (the question cannot be edited): only a press that changed nothing needs a word of its own.
            if not told.decided:
                await self.inbox.until_stored(
                    lambda: call(self.inbox.reply, inbound, told.text, kind="approval_press"),
                    f"telling {inbound.sender_id} what came of their answer",
                )
            self._taken_in(inbound, "command")
            return
        if item.media is None:
            self._taken_in(inbound, await self.inbox.handle(inbound))
            return
        if not await self.inbox.may_download(inbound.sender_id):
            # A stranger still gets a pairing code, but nothing is downloaded.
            text = inbound.text or "(an attachment)"
            self._taken_in(inbound, await self.inbox.handle(replace(inbound, text=text)))
            return
        await self.media.store(inbound, item.media)

    # -- media, fetched after the webhook was answered (adapters.whatsapp_media) ---------------------------
    async def _download(self, sender: str, wamid: str, media: dict[str, Any], kind: str) -> Path:
        """Fetch a message's media from the Graph API into the sender's upload folder (once: a file already
        there is kept); the download of :class:`adapters.whatsapp_media.MediaJobs`."""
        assert self.http is not None
        folder = upload_folder(self, sender)
        # "audio/ogg; codecs=opus" (a voice note) is audio/ogg: the suffix tells a recording (adapters/voice.py).
        mime = str(media.get("mime_type") or "").split(";", 1)[0].strip()
        extension = mimetypes.guess_extension(mime) or ".bin"
        name = str(media.get("filename") or f"{kind}{extension}")
        path = folder / f"{safe_filename(wamid)[-16:]}-{safe_filename(name)}"
        if path.exists():
            return path
        if not media.get("id"):
            raise ValueError("the message names no media id")
        info = await self.http.get(self._url(str(media.get("id"))), headers=self._auth)
        info.raise_for_status()
        data = await self.http.get(str(as_dict(info.json())["url"]), headers=self._auth)
        data.raise_for_status()
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data.content)
        tmp.replace(path)
        return path

    # -- read receipts and typing ------------------------------------------------------------------------------
    def _taken_in(self, inbound: Inbound, outcome: HandleOutcome) -> None:
        """Mark a message read once it is committed (in the background): with "typing…" when an agent will
        answer it; not for duplicates, ignored or unpaired senders (nobody here has read those)."""
        if not self.config.read_receipts or outcome not in ("queued", "command", "pairing_code"):
            return
        typing = outcome == "queued" and self.config.typing
        task = asyncio.create_task(self._mark_read(inbound.external_id, typing=typing))
        self._receipts.add(task)
        task.add_done_callback(self._receipts.discard)

    async def _mark_read(self, wamid: str, *, typing: bool) -> None:
        """One read receipt (and typing indicator): tried once; a failure costs only the blue ticks."""
        if self.http is None or not wamid:
            return
        body: dict[str, Any] = {"messaging_product": "whatsapp", "status": "read", "message_id": wamid}
        if typing:
            body["typing_indicator"] = {"type": "text"}
            self._typing_at[wamid] = time.monotonic()
        try:
            response = await self.http.post(
                self._url(f"{self.phone_number_id}/messages"), headers=self._auth, json=body, timeout=10.0
            )
        except httpx.HTTPError as exc:
            self.log.info("could not mark %s read: %s", wamid, exc)
            return
        if response.status_code != 200:
            self.log.info(
                "WhatsApp refused to mark %s read: %s %.200s", wamid, response.status_code, response.text
            )

    async def send_typing(self, conversation: str) -> None:
        if not self.config.read_receipts:
            return  # the Cloud API's typing indicator is part of a read receipt
        # Typing shows on the chat's newest waiting message.
        wamid = await call(
            newest_waiting_external_id, self.rt.db, ChatAddress(self.name, conversation=conversation)
        )
        if wamid is None:
            return
        now = time.monotonic()
        if now - self._typing_at.get(wamid, -1e9) < self.config.typing_interval_seconds / 2:
            return  # just shown with its read receipt
        if len(self._typing_at) > 1000:
            self._typing_at = {k: t for k, t in self._typing_at.items() if now - t < 60}
        await self._mark_read(wamid, typing=True)

    # -- receipts --------------------------------------------------------------------------------------------
    async def _on_status(self, status: dict[str, Any]) -> None:
        """A ``failed`` receipt for a message we sent marks its reply failed, with Meta's reason."""
        if status.get("status") != "failed":
            return
        wamid = str(status.get("id") or "")
        response_id = await call(self.rt.queue.responses.response_for_platform_id, self.name, wamid)
        errors = [e for e in as_list(status.get("errors")) if isinstance(e, dict)]
        error = errors[0] if errors else {}
        code = as_int(error.get("code"))
        title = str(error.get("title") or error.get("message") or "failed")
        details = str(as_dict(error.get("error_data")).get("details") or "")
        reason = f"WhatsApp {code}: {title}" + (f" ({details})" if details else "")
        if response_id is None:
            self.log.info("a message %s we do not know (any more) failed: %s", wamid, reason)
            return
        changed = await call(
            self.rt.queue.responses.fail_response,
            response_id,
            reason,
            explanation=f"WhatsApp: {explain(code, title)}",
        )
        if changed:
            self.log.error("WhatsApp reported reply %s (message %s) failed: %s", response_id, wamid, reason)

    # -- sending -------------------------------------------------------------------------------------------
    async def _graph_post(self, edge: str, **kwargs: Any) -> dict[str, Any]:
        """POST to the Graph API, backing off on throughput errors, 429 and 5xx."""
        assert self.http is not None, "the adapter is not open"
        url = self._url(f"{self.phone_number_id}/{edge}")
        for attempt in range(self.config.send_retries + 1):
            response = await self.http.post(url, headers=self._auth, **kwargs)
            if response.status_code == 200:
                result: dict[str, Any] = response.json()
                return result
            try:
                error = response.json().get("error") or {}
            except ValueError:
                error = {"message": response.text[:200]}
            retryable = (
                error.get("code") in THROUGHPUT_CODES
                or response.status_code == 429
                or response.status_code >= 500
            )
            if not retryable or attempt == self.config.send_retries:
                raise GraphSendError(response.status_code, as_dict(error))
            delay = Backoff(self.config.backoff_base_seconds, self.config.backoff_max_seconds).delay(
                attempt + 1
            )
            self.log.info("Graph API throughput limit (%s); retrying in %.2f s", error.get("code"), delay)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def send_text(self, conversation: str, text: str) -> str | None:
        sent = await self._graph_post(
            "messages",
            json={
                "messaging_product": "whatsapp",
                "recipient_type": "individual",
                "to": conversation,
                "type": "text",
                "text": {"body": text, "preview_url": False},
            },
        )
        return wamid_of(sent)

    async def send_question(self, conversation: str, text: str, buttons: Sequence[Button]) -> str | None:
        ask, lead = text, ""
        body = whatsapp_graph.question_message(conversation, ask, list(buttons))
        if body is None and "\n\n" in text:
            # Longer than a button message takes (an edit's diff, a long command): the question in full as
            # text, then its last paragraph ("Allow it? …") with the buttons.
            lead, _, ask = text.rpartition("\n\n")
            body = whatsapp_graph.question_message(conversation, ask, list(buttons))
        if body is None:
            return await super().send_question(conversation, text, buttons)
        if lead:
            await self.send_text(conversation, lead)
        try:
            sent = await self._graph_post("messages", json=body)
        except GraphSendError as exc:
            failure = self.classify_send_error(exc)
            if not failure.permanent or exc.code == whatsapp_graph.REENGAGEMENT_CODE:
                raise  # worth retrying as it is, or no message at all may be sent now
            self.log.info("WhatsApp refused a question with buttons (%s); asking it as text", failure.reason)
            return await super().send_question(conversation, ask, buttons)
        return wamid_of(sent)

    #: The MIME type a file is uploaded as (:func:`adapters.whatsapp_graph.document_type`).
    document_type = staticmethod(whatsapp_graph.document_type)

    async def send_file(self, conversation: str, path: Path, caption: str) -> str | None:
        mime = self.document_type(path)
        uploaded = await self._graph_post(
            "media",
            data={"messaging_product": "whatsapp", "type": mime},
            files={"file": (path.name, path.read_bytes(), mime)},
        )
        document: dict[str, Any] = {"id": str(uploaded["id"]), "filename": path.name}
        if caption:
            document["caption"] = caption[:1024]
        sent = await self._graph_post(
            "messages",
            json={
                "messaging_product": "whatsapp",
                "to": conversation,
                "type": "document",
                "document": document,
            },
        )
        return wamid_of(sent)

    def classify_send_error(self, exc: Exception) -> SendFailure:
        return whatsapp_graph.classify_send_error(exc)
