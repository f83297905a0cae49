"""Doctor checks for channels: which tokens are set, and can the platform's address be reached? Slack's token
is also tried (``auth.test``), and the permissions it was granted compared with what the adapter needs."""

from __future__ import annotations

import socket
from collections.abc import Mapping
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
#: Variables of which each bundled channel needs one more (Slack: how it receives).
CHANNEL_ONE_OF: dict[str, tuple[str, ...]] = {
    name: model.one_of_env for name, model in BUILTIN_CHANNELS.items() if model.one_of_env
}
#: Slack scopes the adapter cannot work without (it cannot send), and the ones each of its parts needs.
SLACK_SCOPES_NEEDED = ("chat:write",)
SLACK_SCOPES_WANTED = {
    "channels:history": "messages in public channels",
    "groups:history": "messages in private channels",
    "im:history": "direct messages",
    "mpim:history": "group direct messages",
    "files:read": "files people share",
    "files:write": "files in replies",
    "users:read": "senders' names",
    "commands": "the slash command",
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


def slack_check(env: Mapping[str, str], url: str) -> Check:
    """Slack's bot token tried with ``auth.test`` at ``url``: refused, or the scopes it lacks (Slack lists
    the granted ones in the ``x-oauth-scopes`` header); the app-level token with ``apps.connections.open``."""
    from slack_sdk.errors import SlackApiError
    from slack_sdk.web import WebClient

    client = WebClient(token=env.get("SLACK_BOT_TOKEN", ""), base_url=url.rstrip("/") + "/", timeout=5)
    try:
        me = client.auth_test()
        if env.get("SLACK_APP_TOKEN"):
            client.apps_connections_open(app_token=env["SLACK_APP_TOKEN"])
    except SlackApiError as exc:
        which = (
            "SLACK_APP_TOKEN" if "apps.connections.open" in str(exc.response.api_url) else "SLACK_BOT_TOKEN"
        )
        error = exc.response.get("error") or exc.response.status_code
        return Check(
            "channels",
            "slack",
            "fail",
            f"Slack refused {which} ({error})",
            "copy the Bot User OAuth Token (xoxb-…) into SLACK_BOT_TOKEN"
            if which == "SLACK_BOT_TOKEN"
            else "make an app-level token with connections:write (Basic Information) for SLACK_APP_TOKEN",
        )
    except OSError as exc:
        return Check(
            "channels", "slack", "fail", f"{url} unreachable ({exc})", "check the network or SLACK_API_URL"
        )
    granted = {s.strip() for s in str(me.headers.get("x-oauth-scopes", "")).split(",") if s.strip()}
    mode = "Socket Mode" if env.get("SLACK_APP_TOKEN") else "the Events API"
    who = f"bot {me.get('user')} in {me.get('team')}, receiving by {mode}"
    lacking = [s for s in SLACK_SCOPES_NEEDED if s not in granted]
    if lacking:
        fix = f"add the {', '.join(lacking)} scope (OAuth & Permissions), then reinstall the app"
        return Check("channels", "slack", "fail", f"{who}, but it may not post: no {', '.join(lacking)}", fix)
    wanted = [s for s in SLACK_SCOPES_WANTED if s not in granted]
    if wanted:
        what = "; ".join(f"{s} ({SLACK_SCOPES_WANTED[s]})" for s in wanted)
        fix = "add them under OAuth & Permissions, then reinstall the app (docs/slack.md)"
        return Check("channels", "slack", "warn", f"{who}; missing scopes: {what}", fix)
    return Check("channels", "slack", "ok", f"{who}; every scope it needs")


def checks(settings: Settings) -> list[Check]:
    """Per channel: configured or not (and which variable is missing); reachable when configured."""
    found: list[Check] = []
    env = settings.env
    for channel, (required, url_var, default_url) in CHANNEL_ENV.items():
        one_of = CHANNEL_ONE_OF.get(channel, ())
        either = f" and {' or '.join(one_of)}" if one_of else ""
        missing = [v for v in required if not env.get(v)]
        if len(missing) == len(required):
            found.append(
                Check(
                    "channels",
                    channel,
                    "warn",
                    f"not configured: set {', '.join(required)}{either}",
                    f"set {' and '.join(required)}{either} to enable {channel}",
                )
            )
            continue
        if one_of and not any(env.get(v) for v in one_of):
            missing.append(" or ".join(one_of))
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
        elif channel == "slack":
            found.append(slack_check(env, url))
        else:
            found.append(Check("channels", channel, "ok", f"token set, {url} reachable"))
    found.append(voice_check(settings))
    return found


def voice_check(settings: Settings) -> Check:
    """Whether voice notes are transcribed: the speech-to-text service named and reachable (adapters/voice.py)."""
    url = (settings.env.get("AGENTPOST_VOICE_API_URL") or settings.voice.api_url).strip()
    if not url:
        return Check(
            "channels",
            "voice notes",
            "ok",
            "off: a chat that sends a voice note is told it cannot be heard here",
            "set [voice] api_url (an OpenAI-compatible speech-to-text service) to transcribe them",
        )
    problem = _reachable(url)
    if problem:
        return Check(
            "channels",
            "voice notes",
            "warn",
            f"the speech-to-text service at {url}: {problem}",
            "check [voice] api_url or AGENTPOST_VOICE_API_URL, and the network",
        )
    key = "with" if settings.env.get("AGENTPOST_VOICE_API_KEY") else "without"
    return Check(
        "channels", "voice notes", "ok", f"transcribed by {url} ({settings.voice.model}, {key} a key)"
    )
