"""The lifecycle every thread-served HTTP fake shares: bind a free loopback port, serve, stop, its URL."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar, Self


class QuietServer(ThreadingHTTPServer):
    """A threading server whose dropped client connections are normal, not errors to print."""

    daemon_threads = True
    fake: Any

    def handle_error(self, request: Any, client_address: Any) -> None:
        return


class ThreadedHttpFake:
    """Base of a fake served by :class:`QuietServer` in a daemon thread; handlers reach it as
    ``self.server.fake``. Subclasses name their server and handler classes and may add to :meth:`close`."""

    server_class: ClassVar[type[QuietServer]] = QuietServer
    handler_class: ClassVar[type[BaseHTTPRequestHandler]]
    thread_name: ClassVar[str] = "fake-http"

    def __init__(self) -> None:
        self._server: QuietServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        """Bind a free port and serve in a daemon thread."""
        server = self.server_class(("127.0.0.1", 0), self.handler_class)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the server and wait for its thread."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @property
    def url(self) -> str:
        """Root URL of the fake, ``http://127.0.0.1:PORT``."""
        if self._server is None:
            raise RuntimeError("the fake is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"
