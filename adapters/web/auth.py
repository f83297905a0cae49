"""Who may talk to the API: a bearer token on every ``/api`` route when one is set, and loopback only without.

Without a token the server listens on loopback only, and answers ``/api`` only for a loopback ``Host`` header,
so a web page on another site cannot reach it through DNS rebinding. Request bodies must be JSON (a browser
cannot send that cross-origin without a CORS preflight). Which web pages may call the API at all — the
server's own and ``api.allowed_origins`` — is decided before this, by :mod:`adapters.web.origins`.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping

from shared.settings import SettingsError

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
            'run agents. Set AGENTPOST_API_TOKEN (or api.token in settings.toml), or use api.host = "127.0.0.1".'
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
