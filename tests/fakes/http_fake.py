"""What the platform fakes share: the lifecycle of a thread-served HTTP fake (bind a free loopback port, serve,
stop, its URL), a quiet HTTP/1.1 handler, use as a context manager, and waiting for a recorded request."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, ClassVar, Self, TypeVar

R = TypeVar("R")


class QuietServer(ThreadingHTTPServer):
    """A threading server whose dropped client connections are normal, not errors to print."""

    daemon_threads = True
    fake: Any

    def handle_error(self, request: Any, client_address: Any) -> None:
        return


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 request handler that logs nothing."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        return


class RoutedHandler(QuietHandler):
    """Hands every GET and POST to the fake's ``answer(verb, target, headers, body)`` (``target`` as asked,
    query included; header names in lower case) and sends back the ``(status, body, headers)`` it returns."""

    server: QuietServer

    def _serve(self, verb: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, data, extra = self.server.fake.answer(verb, self.path, headers, body)
        try:
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")


class ContextFake:
    """``with fake:`` for a fake with ``start()`` (returning itself) and ``close()``."""

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def wait_for_record(
    cond: threading.Condition,
    records: Callable[[], Iterable[R]],
    predicate: Callable[[R], bool],
    timeout: float,
    failure: Callable[[], str],
) -> R:
    """Block on ``cond`` until one of ``records()`` matches ``predicate``; return the first match. After
    ``timeout`` seconds raise ``TimeoutError(failure())`` (called with ``cond`` held)."""
    found: list[R] = []

    def ready() -> bool:
        for record in records():
            if predicate(record):
                found.append(record)
                return True
        return False

    with cond:
        if not cond.wait_for(ready, timeout=timeout):
            raise TimeoutError(failure())
    return found[0]


class ThreadedHttpFake(ContextFake):
    """Base of a fake served by :class:`QuietServer` in a daemon thread; handlers reach it as
    ``self.server.fake``. Subclasses name their server and handler classes and may add to :meth:`close`."""

    server_class: ClassVar[type[QuietServer]] = QuietServer
    handler_class: ClassVar[type[BaseHTTPRequestHandler]]
    thread_name: ClassVar[str] = "fake-http"

    def __init__(self) -> None:
        self._server: QuietServer | None = None
        self._thread: threading.Thread | None = None
        self._more: list[tuple[QuietServer, threading.Thread]] = []

    def start(self) -> Self:
        """Bind a free port and serve in a daemon thread."""
        server = self.server_class(("127.0.0.1", 0), self.handler_class)
        server.fake = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def serve_also(self, host: str) -> str:
        """Serve the same fake on ``host`` as well (a free port there), e.g. a test network's own address
        (tests/netns.py), so clients in several places talk to one fake; returns that root URL."""
        server = self.server_class((host, 0), self.handler_class)
        server.fake = self
        thread = threading.Thread(target=server.serve_forever, name=self.thread_name, daemon=True)
        thread.start()
        self._more.append((server, thread))
        return f"http://{host}:{server.server_address[1]}"

    def close(self) -> None:
        """Stop the server(s) and wait for their threads."""
        for server, thread in self._more:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        self._more.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def url(self) -> str:
        """Root URL of the fake, ``http://127.0.0.1:PORT``."""
        if self._server is None:
            raise RuntimeError("the fake is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"
