"""The channel adapters and the web adapter, each its own process.

A chat channel is a platform under the one channel runner:

- :mod:`adapters.platform` — the seam: :class:`~adapters.platform.Platform`, what differs per platform
  (connect, receive, send text/files/notes, edit, typing, error classification, limits). A new channel
  implements it and names its class in the ``agentpost.channels`` entry point; :mod:`adapters.telegram`,
  :mod:`adapters.discord` (with :mod:`adapters.discord_catch_up`), :mod:`adapters.whatsapp` (with
  :mod:`adapters.whatsapp_graph` and :mod:`adapters.whatsapp_media`) and :mod:`adapters.slack` (with
  :mod:`adapters.slack_intake` and :mod:`adapters.slack_events`) are the built-in ones;
  :mod:`adapters.chat_turns` keeps one chat's inbound messages in order for those whose library handles
  events side by side.
- :mod:`adapters.runner` — :class:`~adapters.runner.ChannelRunner`, the same for every platform, composed of
  :mod:`adapters.intake` (allowlist and pairing, dedupe, enqueue), :mod:`adapters.chat_commands`,
  :mod:`adapters.delivery` (claiming, chunking, typing, retries; with :mod:`adapters.previews` and
  :mod:`adapters.progress_notes`) and :mod:`adapters.channel_lifecycle` (open with retries, health,
  signals); helpers :mod:`adapters.chunking`, :mod:`adapters.pairing`.
- :mod:`adapters.web` — the REST/SSE/WebSocket API and dashboard (it queues through the same queue, not
  through the runner); :mod:`adapters.commands` and :mod:`adapters.doctor` plug into the CLI.

May import ``shared`` (never ``workers`` or ``scheduler``); ``shared`` never imports it.
"""
