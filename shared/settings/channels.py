"""The ``[channels.<name>]`` sections of settings.toml: the keys every channel has, and the built-in
channels' own (Telegram, Discord, WhatsApp, Slack).

They live in `shared` so that every command checks a channel's section the way its adapter does, without
importing the adapter (its platform library takes most of a second to load). A third-party channel's
model is its plugin class's ``settings_model``, loaded through the ``agentpost.channels`` entry point only
when the file has a section of that name. A section of a channel no plugin provides (``[channels.web]``,
``[channels.cli]``) has the keys every channel has: the processor reads its ``busy_policy``.
"""

from __future__ import annotations

import functools
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.settings.busy_policy import BusyPolicy

#: Pairing requests one channel keeps waiting at once (``pairing_max_pending``'s default).
MAX_PENDING_PAIRINGS = 3


class ChannelSettings(BaseModel):
    """Settings every channel has, in ``[channels.<name>]`` of settings.toml.

    A channel's model also says what its process needs from the environment, so `agentpost up` (which
    secrets go to which process), doctor and the adapter agree without importing the adapter."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The variables the channel cannot start without (its secrets).
    required_env: ClassVar[tuple[str, ...]] = ()
    #: Variables of which at least one must be set as well (two ways to receive: Slack's Socket Mode token
    #: or its Events API signing secret); empty: none.
    one_of_env: ClassVar[tuple[str, ...]] = ()
    #: The variable that overrides the platform's address (a test fake, a proxy), and the address itself.
    address_env: ClassVar[str] = ""
    default_address: ClassVar[str] = ""

    enabled: bool = Field(default=True, description="false: `agentpost up` does not start this channel")
    allowlist: list[str] = Field(
        default_factory=list, description="sender ids served without pairing; '*' serves everyone"
    )
    pairing: bool = Field(
        default=True, description="give unknown senders a pairing code (false: ignore them)"
    )
    pairing_max_pending: int = Field(default=MAX_PENDING_PAIRINGS, ge=1, le=100)
    operator_chat: str = Field(
        default="", description="a chat of this channel told about each new pairing request (empty: none)"
    )
    max_chunks: int = Field(default=4, ge=1, le=50, description="longer replies are sent as a file")
    delivery_batch: int = Field(default=10, ge=1, le=100)
    delivery_attempts: int = Field(
        default=8, ge=1, le=100, description="transient send failures before a reply counts as undeliverable"
    )
    delivery_backoff_base_seconds: float = Field(
        default=2.0, ge=0, description="wait before re-sending after a transient failure (doubles each time)"
    )
    delivery_backoff_max_seconds: float = Field(default=300.0, ge=0)
    typing: bool = True
    typing_interval_seconds: float = Field(default=4.0, gt=0)
    poll_interval_seconds: float = Field(default=0.0, ge=0, description="0: the queue's poll interval")
    busy_policy: BusyPolicy | None = Field(
        default=None, description="this channel's busy policy (unset: [processor] busy_policy)"
    )
    debounce: bool = Field(default=True, description="apply [queue] debounce_ms to this channel's messages")
    busy_notice: bool = Field(
        default=True, description="tell a chat once per run that its message waits behind the agent's run"
    )
    preview: bool = Field(
        default=True,
        description="show a reply while the agent writes it: one message edited in place, then the answer",
    )
    progress_min_interval_seconds: float = Field(
        default=180.0, ge=0, description="platforms that cannot edit: at most one progress note per interval"
    )
    late_message_seconds: float = Field(
        default=60.0, gt=0, description="a message handled this long after it was sent arrived while offline"
    )
    start_retry_base_seconds: float = Field(
        default=1.0, gt=0, description="platform unreachable at start: first wait before trying again"
    )
    start_retry_max_seconds: float = Field(
        default=60.0, gt=0, description="... doubling up to this wait between tries (until stopped)"
    )


class TelegramSettings(ChannelSettings):
    """``[channels.telegram]``."""

    required_env: ClassVar[tuple[str, ...]] = ("TELEGRAM_BOT_TOKEN",)
    address_env: ClassVar[str] = "TELEGRAM_API_BASE_URL"
    default_address: ClassVar[str] = "https://api.telegram.org"

    token_env: str = Field(default="TELEGRAM_BOT_TOKEN", description="variable holding the bot token")
    api_base_url: str = Field(default="", description="Bot API root; TELEGRAM_API_BASE_URL wins")
    parse_mode: Literal["Markdown", "MarkdownV2", "HTML", ""] = "Markdown"
    poll_timeout_seconds: int = Field(default=25, ge=0, le=50)
    rate_limit_retries: int = Field(default=3, ge=0, le=20)


class DiscordSettings(ChannelSettings):
    """``[channels.discord]``."""

    required_env: ClassVar[tuple[str, ...]] = ("DISCORD_BOT_TOKEN",)
    address_env: ClassVar[str] = "DISCORD_API_BASE_URL"
    default_address: ClassVar[str] = "https://discord.com/api/v10"

    token_env: str = Field(default="DISCORD_BOT_TOKEN", description="variable holding the bot token")
    api_base_url: str = Field(default="", description="REST root with version; DISCORD_API_BASE_URL wins")
    gateway_url: str = Field(default="", description="gateway websocket URL; DISCORD_GATEWAY_URL wins")
    guild_ready_timeout_seconds: float = Field(default=2.0, ge=0)
    ready_timeout_seconds: float = Field(default=60.0, gt=0)
    catch_up: bool = Field(default=True, description="after a start, read what arrived while down")
    catch_up_window_hours: float = Field(
        default=24.0, gt=0, description="catch up on messages at most this old"
    )
    catch_up_max_per_channel: int = Field(
        default=50, ge=1, le=1000, description="catch up on at most this many messages per channel"
    )


class WhatsAppSettings(ChannelSettings):
    """``[channels.whatsapp]``."""

    required_env: ClassVar[tuple[str, ...]] = (
        "WHATSAPP_ACCESS_TOKEN",
        "WHATSAPP_PHONE_NUMBER_ID",
        "WHATSAPP_APP_SECRET",
        "WHATSAPP_VERIFY_TOKEN",
    )
    address_env: ClassVar[str] = "WHATSAPP_GRAPH_URL"
    default_address: ClassVar[str] = "https://graph.facebook.com"

    graph_url: str = Field(default="", description="Graph API root; WHATSAPP_GRAPH_URL wins")
    api_version: str = Field(default="v21.0", pattern=r"^v\d+\.\d+$")
    webhook_host: str = Field(default="127.0.0.1", description="put a TLS reverse proxy in front")
    webhook_port: int = Field(default=8787, ge=1, le=65535, description="WHATSAPP_WEBHOOK_PORT wins")
    send_retries: int = Field(default=5, ge=0, le=20)
    backoff_base_seconds: float = Field(default=0.5, ge=0)
    backoff_max_seconds: float = Field(default=30.0, ge=0)
    media_timeout_seconds: float = Field(default=60.0, gt=0, description="one inbound media download")
    media_attempts: int = Field(default=3, ge=1, le=20, description="downloads tried before giving up")
    media_poll_seconds: float = Field(default=5.0, gt=0)
    read_receipts: bool = Field(
        default=True, description="mark each message read (blue ticks) once it is taken in"
    )
    # WhatsApp shows "typing…" for up to 25 s per call (or until the reply arrives): refresh well inside it.
    typing_interval_seconds: float = Field(default=20.0, gt=0, le=24)
    # WhatsApp cannot edit a sent message: a preview would be a second message left behind the answer.
    preview: bool = Field(default=False, description="WhatsApp cannot edit messages: always false")

    @field_validator("preview")
    @classmethod
    def _no_preview(cls, value: bool) -> bool:
        if value:
            raise ValueError(
                "WhatsApp cannot edit a sent message, so it has no live preview: remove the key or set false"
            )
        return value


class SlackSettings(ChannelSettings):
    """``[channels.slack]``."""

    required_env: ClassVar[tuple[str, ...]] = ("SLACK_BOT_TOKEN",)
    # Socket Mode (no public URL: the self-hosted default) or the Events API over HTTP.
    one_of_env: ClassVar[tuple[str, ...]] = ("SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET")
    address_env: ClassVar[str] = "SLACK_API_URL"
    default_address: ClassVar[str] = "https://slack.com/api/"

    api_url: str = Field(default="", description="Web API root; SLACK_API_URL wins")
    webhook_host: str = Field(
        default="127.0.0.1", description="Events API over HTTP: put a TLS reverse proxy in front"
    )
    webhook_port: int = Field(default=8788, ge=1, le=65535, description="SLACK_WEBHOOK_PORT wins")
    rate_limit_retries: int = Field(
        default=2, ge=0, le=10, description="a call Slack rate-limits is sent again after its Retry-After"
    )
    socket_down_seconds: float = Field(
        default=120.0, gt=0, description="Socket Mode down this long: the adapter stops (and is restarted)"
    )
    slash_command: str = Field(
        default="/agentpost",
        pattern=r"^/[a-z0-9_-]{1,31}$",
        description="the app's slash command: its text is a chat command (/agentpost status)",
    )
    download_max_bytes: int = Field(
        default=50 * 1024 * 1024, ge=0, description="inbound files larger than this are not downloaded"
    )
    # chat.update is in Slack's Tier 3 (about 50 a minute per workspace): one edit a second stays inside it.
    preview_edit_seconds: float = Field(default=1.0, gt=0, description="least time between preview edits")


BUILTIN_CHANNELS: dict[str, type[ChannelSettings]] = {
    "telegram": TelegramSettings,
    "discord": DiscordSettings,
    "whatsapp": WhatsAppSettings,
    "slack": SlackSettings,
}


def channel_model(name: str) -> type[BaseModel] | None:
    """The model of ``[channels.<name>]``; None when it is a plugin's whose code does not load (its own
    process says why when started; other commands must not fail over it)."""
    if name in BUILTIN_CHANNELS:
        return BUILTIN_CHANNELS[name]
    return _plugin_model(name)


@functools.lru_cache(maxsize=64)  # bounded: the web API validates names a caller sends
def _plugin_model(name: str) -> type[BaseModel] | None:
    from importlib.metadata import entry_points

    for ep in entry_points(group="agentpost.channels", name=name):
        try:
            plugin = ep.load()
        except Exception:
            return None
        model = getattr(plugin, "settings_model", None)
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model
        return None
    return ChannelSettings
