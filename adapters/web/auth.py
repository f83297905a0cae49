"""Who may talk to the API: the API token on every ``/api`` route, and loopback only without one.

The token (:mod:`shared.settings.api_token` decides which) may come as ``Authorization: Bearer``, ``?token=`` (what
``EventSource`` and browsers' WebSockets can send), the dashboard's sign-in cookie (:mod:`adapters.web.signin`)
or a ``/t/<token>`` path prefix for clients that cannot send any of those (:class:`adapters.web.signin.TokenPrefix`
checks it and marks the request). Only with ``api.allow_open_loopback`` and no token does the server answer
without one; it then listens on loopback only, and answers ``/api`` only for a loopback ``Host`` header, so a
web page on another site cannot reach it through DNS rebinding. Request bodies must be JSON (a browser cannot
send that cross-origin without a CORS preflight). Which web pages may call the API at all — the server's own
and ``api.allowed_origins`` — is decided before this, by :mod:`adapters.web.origins`.
"""

from __future__ import annotations

import enum
import hmac
import ipaddress
from collections.abc import Mapping

from starlette.requests import HTTPConnection
from starlette.websockets import WebSocket

from shared.settings.api_token import cookie_name, cookie_value
from shared.settings.model import SettingsError

from .errors import ApiError
from .state import web_state

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """True for ``127.0.0.0/8``, ``::1`` and ``localhost``; False for ``0.0.0.0``, ``::`` and other hosts."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str) -> None:
    """Refuse to listen beyond loopback without a token (raises :class:`SettingsError` with the fix)."""
    if not token and not is_loopback(host):
        raise SettingsError(
            f"refusing to listen on {host!r} without an API token: anyone who can reach that address could "
            "run agents. Set AGENTPOST_API_TOKEN or api.token, or remove api.allow_open_loopback (a token is "
            'then made in the api-token file), or use api.host = "127.0.0.1".'
        )


def host_header_is_loopback(headers: Mapping[str, str]) -> bool:
    """True when the request's ``Host`` header names a loopback address (port ignored)."""
    host = headers.get("host", "")
    if host.startswith("["):
        name = host[1:].split("]", 1)[0]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return is_loopback(name)


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if any."""
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison, so the response time does not reveal how much of a guess was right."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


class Denial(enum.Enum):
    """Why a request or WebSocket handshake is refused."""

    #: A token is set and the request did not carry it.
    TOKEN = "token"
    #: No token is set and the request is addressed to a name that is not loopback (DNS rebinding).
    LOOPBACK = "loopback"


#: Set in a request's scope by :class:`adapters.web.signin.TokenPrefix` when its ``/t/<token>`` prefix matched.
PREFIX_AUTHENTICATED = "agentpost.token_prefix"


def server_port(conn: HTTPConnection) -> int:
    """The port this request reached (the sign-in cookie is named after it)."""
    server = conn.scope.get("server")
    return int(server[1]) if server and server[1] is not None else 0


def signed_in(conn: HTTPConnection, token: str) -> bool:
    """Whether ``conn`` carries the dashboard's sign-in cookie for ``token``."""
    given = conn.cookies.get(cookie_name(server_port(conn)))
    return bool(token) and token_matches(given, cookie_value(token))


def presents_token(
    conn: HTTPConnection, token: str, *, token_in_query: bool = True, cookie: bool = True
) -> bool:
    """Whether ``conn`` shows ``token`` in one of the ways a client may (see the module docstring)."""
    if conn.scope.get(PREFIX_AUTHENTICATED) is True:
        return True
    given = bearer_token(conn.headers)
    if given is None and token_in_query:
        given = conn.query_params.get("token")
    if token_matches(given, token):
        return True
    return cookie and signed_in(conn, token)


def access_denial(conn: HTTPConnection, token: str, *, token_in_query: bool = True) -> Denial | None:
    """The one access rule, for HTTP requests and WebSocket handshakes alike: with a token, the token
    (:func:`presents_token`); without one (only with ``api.allow_open_loopback``), a loopback ``Host``.
    ``None``: let it in."""
    if token:
        return None if presents_token(conn, token, token_in_query=token_in_query) else Denial.TOKEN
    return None if host_header_is_loopback(conn.headers) else Denial.LOOPBACK


_HTTP_REFUSALS = {
    Denial.TOKEN: (
        401,
        "missing or wrong API token: send Authorization: Bearer <token> (on the server, `agentpost token` "
        "shows it, the dashboard's sign-in link and the base URL for clients that send no token)",
    ),
    Denial.LOOPBACK: (403, "without an API token the API answers only requests addressed to loopback"),
}
_WEBSOCKET_CLOSES = {
    Denial.TOKEN: (4401, "missing or wrong API token"),
    Denial.LOOPBACK: (4403, "loopback only without an API token"),
}


async def require_access(conn: HTTPConnection) -> None:
    """The dependency of every ``/api`` route: :func:`access_denial` answered as 401 or 403."""
    denial = access_denial(conn, web_state(conn).token)
    if denial is not None:
        raise ApiError(*_HTTP_REFUSALS[denial])


async def require_metrics_token(conn: HTTPConnection) -> None:
    """``/metrics`` asks only for the token, in the header (or the path prefix), where scrapers send it: not
    in the query, which ends up in logs, nor the browser's cookie. Without a token it is open to whoever
    reaches the server, which then listens on loopback only (:func:`check_bind`)."""
    token = web_state(conn).token
    if token and not presents_token(conn, token, token_in_query=False, cookie=False):
        raise ApiError(*_HTTP_REFUSALS[Denial.TOKEN])


async def admit_websocket(websocket: WebSocket) -> bool:
    """Check a WebSocket handshake by :func:`access_denial`; a refused one is closed (4401 or 4403) and
    ``False`` returned."""
    denial = access_denial(websocket, web_state(websocket).token)
    if denial is None:
        return True
    code, reason = _WEBSOCKET_CLOSES[denial]
    await websocket.close(code=code, reason=reason)
    return False
