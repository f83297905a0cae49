"""Which web pages may talk to the API: the server's own, and the origins listed in ``api.allowed_origins``.

A browser names the page a request comes from in the ``Origin`` header (on every cross-origin request,
every WebSocket handshake and every same-origin write). A request that carries an ``Origin`` which is neither
the server's own (the scheme, host and port the request was addressed to) nor an allowed one is refused with
403 — or, for a WebSocket, closed with 1008 (policy violation) before it is accepted — whether or not it
carries a valid token: a token typed into one page must not be usable by another. Requests without an
``Origin`` (curl, channel clients, other servers) are not browsers acting for a page and pass unchanged.

Allowed origins get CORS: a preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is answered here
with the methods and headers the API takes (``Authorization`` included), and their responses carry
``Access-Control-Allow-Origin`` naming that one origin (never ``*``) and ``Vary: Origin``. No cookies are used,
so credentials are never allowed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: (scheme, host, port) of an origin, lower-cased, with the scheme's default port filled in.
Origin = tuple[str, str, int]

_DEFAULT_PORTS = {"http": 80, "https": 443}
_SCHEMES = {"http": "http", "https": "https", "ws": "http", "wss": "https"}
#: Used when the app does not say which methods its routes serve.
DEFAULT_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
ALLOW_HEADERS = b"Authorization, Content-Type, Last-Event-ID"
#: What a script on an allowed origin may read besides the basic response headers.
EXPOSE_HEADERS = b"Retry-After"
PREFLIGHT_MAX_AGE = b"600"


def parse_origin(text: str) -> Origin | None:
    """``"https://Office.example.com"`` → ``("https", "office.example.com", 443)``; ``None`` if it is not an
    http(s) origin (``"null"``, a path, a user name, a bad port, …)."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.username is not None:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def own_origin(scope: Scope, host: str) -> Origin | None:
    """The origin a page served by this request's address would have: the request's scheme and Host header."""
    scheme = _SCHEMES.get(str(scope.get("scheme", "http")), "http")
    return parse_origin(f"{scheme}://{host}") if host else None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


class OriginGuard:
    """ASGI middleware: refuse foreign origins, answer CORS for allowed ones (see the module docstring)."""

    def __init__(
        self, app: ASGIApp, allowed: Iterable[str], methods: Iterable[str] = DEFAULT_METHODS
    ) -> None:
        self.app = app
        self.allowed = {o for o in (parse_origin(text) for text in allowed) if o is not None}
        # A preflight must name every method a route serves: TinyOffice saves with PUT, and a browser that
        # is not told PUT is allowed never sends the request (curl, which ignores CORS, would succeed).
        self.allow_methods = ", ".join(sorted({m.upper() for m in methods} | {"OPTIONS"})).encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        origin_text = _header(scope, b"origin")
        if origin_text is None:
            await self.app(scope, receive, send)
            return
        origin = parse_origin(origin_text)
        allowed = origin is not None and origin in self.allowed
        if not allowed and (origin is None or origin != own_origin(scope, _header(scope, b"host") or "")):
            await self._refuse(scope, send, origin_text)
            return
        if not allowed or scope["type"] != "http":
            await self.app(scope, receive, send)  # the server's own page: no CORS needed
            return
        cors = [
            (b"access-control-allow-origin", origin_text.encode("latin-1")),
            (b"access-control-expose-headers", EXPOSE_HEADERS),
            (b"vary", b"Origin"),
        ]
        if scope["method"] == "OPTIONS" and _header(scope, b"access-control-request-method") is not None:
            # A preflight carries no token (browsers never send one with it), so it is answered before any
            # auth: all it reveals is what the API would accept from this origin.
            headers = [
                *cors,
                (b"access-control-allow-methods", self.allow_methods),
                (b"access-control-allow-headers", ALLOW_HEADERS),
                (b"access-control-max-age", PREFLIGHT_MAX_AGE),
                (b"content-length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 204, "headers": headers})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _refuse(self, scope: Scope, send: Send, origin_text: str) -> None:
        reason = (
            f"requests from web pages on {origin_text[:200]} are not allowed "
            "(an operator can add that origin to api.allowed_origins)"
        )
        if scope["type"] == "websocket":
            # Before accepting, a close makes the server answer the handshake with 403.
            await send({"type": "websocket.close", "code": 1008, "reason": "this origin is not allowed"})
            return
        body = json.dumps({"error": reason}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"vary", b"Origin"),
            (b"connection", b"close"),  # whatever body follows is not read
        ]
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
