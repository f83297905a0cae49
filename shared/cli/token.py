"""``agentpost token``: the web API's token, where it comes from, the dashboard's sign-in link and the base URL
for clients that send no token (TinyAGI's); ``--new`` replaces the token in the home's token file."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from shared.cli.main import JsonFlag, console, fail, print_json
from shared.settings import api_token
from shared.settings.model import SettingsError, load_settings


def token_command(
    new: Annotated[
        bool,
        typer.Option(
            "--new", help="Replace the token in the token file (every client then needs the new one)."
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show the API token's sign-in link for the dashboard and the base URL for TinyAGI's clients."""
    try:
        settings = load_settings()
        found = api_token.resolve(settings)
        if new:
            if found.source in (api_token.Source.ENVIRONMENT, api_token.Source.SETTINGS):
                raise fail(f"the token in force comes from {found.source.value}; change it there instead")
            api_token.write_token_file(settings.home, replace=True)
        found = api_token.ensure(settings) if found.source is not api_token.Source.OPEN else found
    except SettingsError as exc:
        raise fail(str(exc), 2) from None
    host, port = settings.api.host, settings.api.port
    if not found.required:
        data = {"required": False, "source": found.source.value}
        if as_json:
            print_json(data)
            return
        console.print(
            "the API asks for no token: api.allow_open_loopback is on, so every program on this machine, "
            "agents included, may use it. Remove that setting to have a token made.",
            highlight=False,
        )
        return
    link = api_token.sign_in_link(host, port, found.value)
    base = api_token.tinyagi_base_url(host, port, found.value)
    if as_json:
        print_json({"required": True, "source": found.source.value, "signInLink": link, "baseUrl": base})
        return
    where = (
        f"{found.source.value} ({found.path})"
        if found.source is api_token.Source.FILE
        else found.source.value
    )
    console.print(f"token from {escape(where)}", highlight=False)
    console.print(f"dashboard sign-in link: [bold]{escape(link)}[/]")
    console.print(f"base URL for clients that send no token (TinyOffice): [bold]{escape(base)}[/]")
    console.print("curl and scripts: send  Authorization: Bearer <the token>", highlight=False)
    if new:
        console.print(
            "a new token was written; restart the web process for it to take effect: agentpost restart web",
            highlight=False,
        )
