"""The WhatsApp channel over the official Cloud API: signed webhooks in, Graph API calls out.

- The webhook is served by uvicorn at ``/webhook`` on ``WHATSAPP_WEBHOOK_PORT``: the verification GET
  (``hub.verify_token`` compared in constant time) and message POSTs. Every POST's
  ``X-Hub-Signature-256`` is checked over the raw body (HMAC-SHA256 with the app secret, constant-time
  compare) before the body is parsed; a missing or wrong signature is refused with 403 and changes nothing.
- Inbound messages are queued with the wamid as ``external_id``, so Meta's redeliveries are not queued twice;
  the POST is answered 200 only after every message in it is committed (a 500 makes Meta retry). Delivery
  receipts (``statuses``) are ignored.
- Replies go through ``POST {graph}/{version}/{phone_number_id}/messages`` with backoff on the throughput
  errors 130429 and 131056 (and 429/5xx). Files are uploaded to ``/media`` and sent as documents.
  WhatsApp cannot edit a sent message, so a run's progress notes are new messages, at most one every
  ``progress_min_interval_seconds`` (see :mod:`adapters.delivery`).

Environment: ``WHATSAPP_ACCESS_TOKEN``, ``WHATSAPP_PHONE_NUMBER_ID``, ``WHATSAPP_APP_SECRET``,
``WHATSAPP_VERIFY_TOKEN``, ``WHATSAPP_GRAPH_URL`` (default ``https://graph.facebook.com``),
``WHATSAPP_WEBHOOK_PORT`` (default 8787).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import mimetypes
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import uvicorn
from pydantic import Field
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from adapters.base import Channel, ChannelSettings, Inbound, safe_filename
from shared.settings import SettingsError

DEFAULT_GRAPH = "https://graph.facebook.com"
THROUGHPUT_CODES = frozenset({130429, 131056})


class WhatsAppSettings(ChannelSettings):
    """``[channels.whatsapp]``."""

    graph_url: str = Field(default="", description="Graph API root; WHATSAPP_GRAPH_URL wins")
    api_version: str = Field(default="v21.0", pattern=r"^v\d+\.\d+$")
    webhook_host: str = Field(default="127.0.0.1", description="put a TLS reverse proxy in front")
    webhook_port: int = Field(default=8787, ge=1, le=65535, description="WHATSAPP_WEBHOOK_PORT wins")
    send_retries: int = Field(default=5, ge=0, le=20)
    backoff_base_seconds: float = Field(default=0.5, ge=0)
    backoff_max_seconds: float = Field(default=30.0, ge=0)


class GraphSendError(Exception):
    """The Graph API refused a request (after the retries for throughput errors)."""


def valid_signature(app_secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is ``sha256=<hex HMAC-SHA256(app_secret, body)>`` (constant-time compare)."""
    if not header or not header.startswith("sha256="):
        return False
    expected = hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.removeprefix("sha256=").strip().lower().encode())


class _QuietServer(uvicorn.Server):
    # The adapter owns SIGTERM/SIGINT; uvicorn must not take them over inside our process.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class WhatsAppChannel(Channel):
    """The WhatsApp Cloud API adapter (``agentpost run whatsapp``)."""

    name: ClassVar[str] = "whatsapp"
    prefix: ClassVar[str] = "whatsapp"
    limit: ClassVar[int] = 4096
    settings_model: ClassVar[type[ChannelSettings]] = WhatsAppSettings

    config: WhatsAppSettings
    http: httpx.AsyncClient | None = None
    server: _QuietServer | None = None
    server_task: asyncio.Task[None] | None = None

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
        self.http = httpx.AsyncClient(timeout=30.0)
        config = uvicorn.Config(
            self.webhook_app(),
            host=self.config.webhook_host,
            port=self.port,
            log_level="warning",
            lifespan="off",
            access_log=False,
        )
        self.server = _QuietServer(config)
        self.server_task = asyncio.create_task(self.server.serve(), name="whatsapp-webhook")
        while not self.server.started:
            if self.server_task.done():
                self.server_task.result()
                raise RuntimeError(f"the webhook server did not start on port {self.port}")
            await asyncio.sleep(0.02)
        self.log.info("WhatsApp webhook listening on %s:%s/webhook", self.config.webhook_host, self.port)

    async def close(self) -> None:
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
        stop = asyncio.create_task(self.stop_event.wait())
        done, _ = await asyncio.wait({self.server_task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if self.server_task in done:
            self.server_task.result()
            raise RuntimeError("the webhook server stopped")

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
        except ValueError:
            return PlainTextResponse("body is not JSON", status_code=400)
        inbound = list(self._messages(payload))
        if inbound:
            await self.test_pause_after_fetch(f"{len(inbound)} WhatsApp message(s)")
        try:
            for message, contact_name in inbound:
                await self._handle_message(message, contact_name)
        except Exception:
            self.log.exception("could not queue a webhook's messages; Meta will redeliver")
            return PlainTextResponse("try again", status_code=500)
        return PlainTextResponse("ok")

    def _messages(self, payload: Any) -> Iterator[tuple[dict[str, Any], str]]:
        """The inbound messages of a webhook payload with the sender's profile name (receipts skipped)."""
        if not isinstance(payload, dict):
            return
        for entry in payload.get("entry") or []:
            for change in entry.get("changes") or []:
                value = change.get("value") or {}
                number = (value.get("metadata") or {}).get("phone_number_id")
                if number and str(number) != self.phone_number_id:
                    continue  # another number of the same app
                names = {
                    str(c.get("wa_id")): str((c.get("profile") or {}).get("name") or "")
                    for c in value.get("contacts") or []
                }
                for message in value.get("messages") or []:
                    yield message, names.get(str(message.get("from")), "")

    async def _handle_message(self, message: dict[str, Any], contact_name: str) -> None:
        sender = str(message.get("from") or "")
        wamid = str(message.get("id") or "")
        kind = str(message.get("type") or "")
        if not sender or not wamid:
            return
        text = ""
        files: list[Path] = []
        if kind == "text":
            text = str((message.get("text") or {}).get("body") or "")
        elif kind in ("document", "image", "audio", "video"):
            media = message.get(kind) or {}
            text = str(media.get("caption") or "")
            if await self.may_download(sender):
                files.append(await self._download(sender, wamid, media, kind))
            elif not text:
                text = "(an attachment)"  # a stranger still gets a pairing code, but nothing is downloaded
        else:
            self.log.info("ignored a WhatsApp %s message from %s", kind, sender)
            return
        await self.handle(
            Inbound(
                conversation=sender,
                sender_id=sender,
                sender=contact_name or sender,
                text=text,
                external_id=wamid,
                files=files,
                metadata={"wamid": wamid, "type": kind},
            )
        )

    async def _download(self, sender: str, wamid: str, media: dict[str, Any], kind: str) -> Path:
        assert self.http is not None
        folder = self.settings.home / "files" / self.name / safe_filename(sender)
        folder.mkdir(parents=True, exist_ok=True)
        extension = mimetypes.guess_extension(str(media.get("mime_type") or "")) or ".bin"
        name = str(media.get("filename") or f"{kind}{extension}")
        path = folder / f"{safe_filename(wamid)[-16:]}-{safe_filename(name)}"
        if path.exists():
            return path
        info = await self.http.get(self._url(str(media.get("id"))), headers=self._auth)
        info.raise_for_status()
        data = await self.http.get(str(info.json()["url"]), headers=self._auth)
        data.raise_for_status()
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data.content)
        tmp.replace(path)
        return path

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
                raise GraphSendError(f"Graph API {response.status_code}: {error.get('message', error)}")
            delay = min(self.config.backoff_max_seconds, self.config.backoff_base_seconds * 2**attempt)
            self.log.info("Graph API throughput limit (%s); retrying in %.2f s", error.get("code"), delay)
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
        raise AssertionError("unreachable")

    async def send_text(self, conversation: str, text: str) -> None:
        await self._graph_post(
            "messages",
            json={
                "messaging_product": "whatsapp",
                "recipient_type": "individual",
                "to": conversation,
                "type": "text",
                "text": {"body": text, "preview_url": False},
            },
        )

    async def send_file(self, conversation: str, path: Path, caption: str) -> None:
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        uploaded = await self._graph_post(
            "media",
            data={"messaging_product": "whatsapp", "type": mime},
            files={"file": (path.name, path.read_bytes(), mime)},
        )
        document: dict[str, Any] = {"id": str(uploaded["id"]), "filename": path.name}
        if caption:
            document["caption"] = caption[:1024]
        await self._graph_post(
            "messages",
            json={
                "messaging_product": "whatsapp",
                "to": conversation,
                "type": "document",
                "document": document,
            },
        )
