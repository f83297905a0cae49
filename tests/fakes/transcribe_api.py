"""A fake OpenAI-compatible speech-to-text service: ``POST …/audio/transcriptions`` (multipart ``file`` and
``model``) answered ``{"text": …}``, recording what it received.

    with FakeTranscriber(words="book the flight") as stt:
        settings: [voice] api_url = stt.base_url            # http://127.0.0.1:PORT/v1
        stt.fail_with(500)                                   # every later request answered 500
        stt.wait_for(lambda r: r.model == "whisper-1", 10)  # a request it received

Answers: 401 without the expected key (when ``key`` is set), 400 without a ``file`` part, else ``status``
(200 by default) with ``{"text": words}``, after ``delay`` seconds.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.fakes.http_fake import QuietHandler, QuietServer, ThreadedHttpFake, wait_for_record
from tests.fakes.telegram_api import parse_form_body


@dataclass(frozen=True)
class Transcription:
    """One request the fake received."""

    path: str
    model: str
    filename: str
    content_type: str
    data: bytes
    authorization: str
    status: int
    at: float = field(default_factory=time.monotonic, compare=False)


class _Server(QuietServer):
    fake: FakeTranscriber


class _Handler(QuietHandler):
    server: _Server

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fake = self.server.fake
        status, payload = fake._answer(
            self.path, self.headers.get("Content-Type", ""), body, self.headers.get("Authorization", "")
        )
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


class FakeTranscriber(ThreadedHttpFake):
    """The fake service (see the module docstring)."""

    server_class = _Server
    handler_class = _Handler
    thread_name = "fake-transcribe"

    def __init__(self, words: str = "hello from a voice note", *, key: str = "", delay: float = 0.0) -> None:
        super().__init__()
        self.words = words
        self.key = key
        self.delay = delay
        self.status = 200
        self._cond = threading.Condition()
        self._received: list[Transcription] = []

    @property
    def base_url(self) -> str:
        """What ``[voice] api_url`` names: the OpenAI-style base, ``http://127.0.0.1:PORT/v1``."""
        return f"{self.url}/v1"

    def fail_with(self, status: int) -> None:
        """Answer every later request with ``status`` and an error body."""
        self.status = status

    @property
    def received(self) -> list[Transcription]:
        with self._cond:
            return list(self._received)

    def wait_for(self, predicate: Callable[[Transcription], bool], timeout: float) -> Transcription:
        """The first request matching ``predicate``, waiting up to ``timeout`` seconds."""
        return wait_for_record(
            self._cond,
            lambda: self._received,
            predicate,
            timeout,
            lambda: f"no matching transcription request in {len(self._received)}",
        )

    def _answer(
        self, path: str, content_type: str, body: bytes, authorization: str
    ) -> tuple[int, dict[str, object]]:
        if self.delay:
            time.sleep(self.delay)
        fields, files = parse_form_body(content_type, body)
        upload = files.get("file")
        if not path.rstrip("/").endswith("/audio/transcriptions"):
            status, payload = 404, {"error": {"message": "not found"}}
        elif self.key and authorization != f"Bearer {self.key}":
            status, payload = (
                401,
                {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}},
            )
        elif upload is None:
            status, payload = 400, {"error": {"message": "file is required"}}
        elif self.status != 200:
            status, payload = self.status, {"error": {"message": "injected failure", "type": "server_error"}}
        else:
            status, payload = 200, {"text": self.words}
        with self._cond:
            self._received.append(
                Transcription(
                    path=path,
                    model=fields.get("model", ""),
                    filename=upload.filename if upload else "",
                    content_type=upload.content_type if upload else "",
                    data=upload.data if upload else b"",
                    authorization=authorization,
                    status=status,
                )
            )
            self._cond.notify_all()
        return status, payload
