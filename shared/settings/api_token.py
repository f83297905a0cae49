"""Which token the web API asks for: the one place that decides it.

The management API can turn an agent's sandbox off, add agents and read every conversation, so it asks for a
token on loopback too: an agent's commands run on the same machine. In order of precedence:

1. ``AGENTPOST_API_TOKEN`` in the environment (given only to the web process by ``agentpost up``);
2. ``[api] token`` in settings.toml;
3. the file ``$AGENTPOST_HOME/api-token`` (``0600``; the home is hidden from agent sandboxes), written by
   ``agentpost init``, or by the web process and ``agentpost up`` when no token exists yet.

Only ``[api] allow_open_loopback = true`` with no token set answers on loopback without one (today's
behaviour before this rule, which ``agentpost doctor`` warns about). The web process finds the token itself,
so nothing else needs to hold it.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from shared.private_files import private_dir
from shared.settings.model import Settings, SettingsError

TOKEN_FILE = "api-token"
ENV_VAR = "AGENTPOST_API_TOKEN"
#: Bytes of randomness in a generated token (43 URL-safe characters).
TOKEN_BYTES = 32


class Source(enum.Enum):
    """Where the token in force comes from."""

    ENVIRONMENT = "the environment (AGENTPOST_API_TOKEN)"
    SETTINGS = "settings.toml ([api] token)"
    FILE = "the token file"
    #: No token, and ``allow_open_loopback`` asked for that: the API answers loopback without one.
    OPEN = "none (allow_open_loopback)"
    #: No token anywhere yet; :func:`ensure` writes the file.
    MISSING = "none yet"


@dataclass(frozen=True)
class ApiToken:
    value: str
    source: Source
    path: Path

    @property
    def required(self) -> bool:
        return bool(self.value)


def token_path(home: Path) -> Path:
    """``$AGENTPOST_HOME/api-token``."""
    return home / TOKEN_FILE


def read_token_file(path: Path) -> str | None:
    """The token stored in ``path``; ``None`` when there is none (missing or empty). Raises
    :class:`SettingsError` when it exists but cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeError) as exc:
        raise SettingsError(
            f"the API token file {path} cannot be read ({exc})",
            fix=f"make {path} readable by agentpost's user, or delete it: a new token is then made",
        ) from None
    value = text.strip()
    return value or None


def resolve(settings: Settings) -> ApiToken:
    """The token in force for ``settings`` (see the module docstring); reads the file, writes nothing."""
    path = token_path(settings.home)
    configured = settings.api.token
    if configured:
        source = Source.SETTINGS if configured == settings.file.api.token else Source.ENVIRONMENT
        return ApiToken(configured, source, path)
    if settings.api.allow_open_loopback:
        return ApiToken("", Source.OPEN, path)
    stored = read_token_file(path)
    if stored is not None:
        return ApiToken(stored, Source.FILE, path)
    return ApiToken("", Source.MISSING, path)


def write_token_file(home: Path, *, replace: bool = False) -> str:
    """Generate a token and store it ``0600`` in ``home``; return the token in the file afterwards.

    Without ``replace`` an existing token is kept (the web process and ``up`` may both get here at once: the
    file is linked into place, so exactly one of them writes it and both read the same token)."""
    private_dir(home)
    path = token_path(home)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    tmp = path.with_name(f".{TOKEN_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(token + "\n")
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
            return token
        try:
            os.link(tmp, path)
        except FileExistsError:
            existing = read_token_file(path)
            if existing is not None:
                return existing
            os.replace(tmp, path)  # an empty file left behind: ours takes its place
            return token
        return token
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def ensure(settings: Settings) -> ApiToken:
    """:func:`resolve`, writing the token file first when no token exists and open loopback was not asked
    for: after this, the API asks for a token unless the operator chose otherwise."""
    found = resolve(settings)
    if found.source is not Source.MISSING:
        return found
    try:
        return ApiToken(write_token_file(settings.home), Source.FILE, found.path)
    except OSError as exc:
        raise SettingsError(
            f"cannot write the API token file {found.path} ({exc.strerror or exc})",
            fix=f"let agentpost's user write {settings.home}, or set AGENTPOST_API_TOKEN",
        ) from None


# -- what a browser holds -------------------------------------------------------------------------------------
def cookie_name(port: int) -> str:
    """The dashboard's sign-in cookie. Browsers share cookies between the ports of one host, so the port is
    part of the name: two agentpost servers on one machine do not sign each other out."""
    return f"agentpost_{port}"


def cookie_value(token: str) -> str:
    """What the sign-in cookie holds: derived from the token (not the token itself), so it is valid exactly
    as long as the token is and is always cookie-safe whatever characters an operator's token has."""
    return hmac.new(token.encode("utf-8"), b"agentpost dashboard sign-in", hashlib.sha256).hexdigest()


def sign_in_link(host: str, port: int, token: str) -> str:
    """The dashboard address that signs a browser in. The token rides in the fragment, which browsers never
    send to the server, so it stays out of logs and proxies; the sign-in page posts it once and forgets it."""
    return f"http://{_shown(host)}:{port}/signin#{token}"


def tinyagi_base_url(host: str, port: int, token: str) -> str:
    """The base URL to give TinyAGI's clients, which send no token: the token as a path prefix."""
    return f"http://{_shown(host)}:{port}/t/{token}"


def _shown(host: str) -> str:
    # A wildcard address is reached on loopback from this machine; an IPv6 address needs its brackets.
    shown = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    return f"[{shown}]" if ":" in shown and not shown.startswith("[") else shown
