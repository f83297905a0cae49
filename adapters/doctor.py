"""Doctor checks for channels: which tokens are set, and can the platform's address be reached?"""

from __future__ import annotations

import socket
from urllib.parse import urlparse

from shared.cli.doctor import Check
from shared.settings.channels import BUILTIN_CHANNELS
from shared.settings.model import Settings

#: Each bundled channel's required variables and the variable that overrides its platform address (with the
#: address itself), as its settings model declares them.
CHANNEL_ENV: dict[str, tuple[tuple[str, ...], str, str]] = {
    name: (model.required_env, model.address_env, model.default_address)
    for name, model in BUILTIN_CHANNELS.items()
}


def _reachable(url: str, timeout: float = 2.0) -> str | None:
    """None when a TCP connection to the URL's host opens, else why not."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port} unreachable ({exc.strerror or exc})"


def checks(settings: Settings) -> list[Check]:
    """Per channel: configured or not (and which variable is missing); reachable when configured."""
    found: list[Check] = []
    env = settings.env
    for channel, (required, url_var, default_url) in CHANNEL_ENV.items():
        missing = [v for v in required if not env.get(v)]
        if len(missing) == len(required):
            found.append(
                Check(
                    "channels",
                    channel,
                    "warn",
                    f"not configured: set {', '.join(required)}",
                    f"set {' and '.join(required)} to enable {channel}",
                )
            )
            continue
        if missing:
            found.append(
                Check(
                    "channels",
                    channel,
                    "fail",
                    f"incomplete: missing {', '.join(missing)}",
                    f"set {', '.join(missing)}",
                )
            )
            continue
        url = env.get(url_var) or default_url
        problem = _reachable(url)
        if problem:
            found.append(
                Check(
                    "channels",
                    channel,
                    "fail",
                    f"token set, but {problem}",
                    f"check the network or {url_var}",
                )
            )
        else:
            found.append(Check("channels", channel, "ok", f"token set, {url} reachable"))
    return found
