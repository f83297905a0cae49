"""``agentpost run web``: serve the web adapter with uvicorn on ``settings.api`` (default 127.0.0.1:3777)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path

import uvicorn

from shared.events.drivers import open_event_log
from shared.events.entries import EventLog
from shared.port_owner import describe_holder
from shared.runtime import open_runtime
from shared.settings import api_token
from shared.settings.model import SettingsError

from .app import create_app
from .auth import check_bind
from .limits import ConnectionLimits, server_config
from .websocket import MAX_FRAME_BYTES

log = logging.getLogger("agentpost.web")


def port_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment with TinyAGI's ``TINYAGI_API_PORT`` taken as ``AGENTPOST_API_PORT`` when only the
    former is set (scripts written for TinyAGI keep working); ``AGENTPOST_API_PORT`` wins when both are."""
    out = dict(env)
    alias = out.get("TINYAGI_API_PORT")
    if alias and not out.get("AGENTPOST_API_PORT"):
        out["AGENTPOST_API_PORT"] = alias
    return out


def listen(host: str, port: int) -> list[socket.socket]:
    """Bind ``host:port`` (every address ``host`` resolves to, as uvicorn would) before anything is served
    or announced, so a taken port is reported in one plain line naming who holds it, not as uvicorn's
    ``[Errno 98]`` after the address was already printed.

    Raises :class:`~shared.settings.model.SettingsError` (``api.port`` cannot be used as set) when it is taken."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise SettingsError(f"api.host {host!r} cannot be resolved ({exc.strerror})") from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # Bound only: uvicorn listens once the app has started, so an open port means it is served.
            sock.bind(address)
    except OSError as exc:
        for sock in socks:
            sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise SettingsError(
                f"port {port} is in use by {describe_holder(port)}; set AGENTPOST_API_PORT to a free port "
                "(or api.port in settings.toml) or stop that program"
            ) from None
        raise SettingsError(
            f"cannot listen on {host}:{port} ({exc.strerror}); check api.host and api.port"
        ) from None
    return socks


def main(home: Path | None = None) -> None:
    """Run the web process in the foreground until interrupted.

    Raises :class:`~shared.settings.model.SettingsError` for unusable settings, including a non-loopback
    ``api.host`` without an API token.
    """
    runtime = open_runtime(home, port_env(os.environ))
    try:
        api = runtime.settings.api
        # The web process finds its token itself (environment, settings, or the home's token file, made
        # now when missing): `agentpost up` need not hand it over, and no other process holds it.
        token = api_token.ensure(runtime.settings)
        check_bind(api.host, token.value)
        sockets = listen(api.host, api.port)
        events: EventLog
        if runtime.settings.events.driver == "sql":
            events = runtime.events
        else:
            events = open_event_log(runtime.settings, runtime.db, wait=runtime.waker.wait_for_change)
        app = create_app(runtime, events=events, token=token.value)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        log.info(
            "agentpost web on http://%s:%d (events: %s; API token: %s)",
            api.host,
            api.port,
            runtime.settings.events.driver,
            token.source.value,
        )
        # Every connection limit (body size and time, request-head deadline, idle keep-alive, connection
        # cap) comes from api.* settings through adapters.web.limits, the one place they are applied.
        config = server_config(
            app,
            host=api.host,
            port=api.port,
            limits=ConnectionLimits.from_settings(api),
            log_level="info",
            access_log=False,
            # Open event streams never end on their own: give them a moment, then close them.
            timeout_graceful_shutdown=2,
            ws="websockets-sansio",
            # A WebSocket frame is bounded too: frames up to this size get an error frame and the socket
            # stays usable (see adapters.web.websocket); larger ones close it (1009) before being buffered.
            ws_max_size=4 * MAX_FRAME_BYTES,
            proxy_headers=False,
            server_header=False,
        )
        try:
            uvicorn.Server(config).run(sockets=sockets)
        finally:
            for sock in sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        if events is not runtime.events:
            events.close()
    finally:
        runtime.close()


if __name__ == "__main__":
    main(None)
