"""Two ways in without typing a token: the dashboard's sign-in link, and a ``/t/<token>`` base URL.

**Sign-in link** (``agentpost up`` prints it): ``/signin#<token>``. Browsers never send the fragment, so the
token reaches neither the server's logs nor a proxy's; the sign-in page's script posts it once to
``POST /signin``, which answers with an ``HttpOnly``, ``SameSite=Strict`` cookie (holding a value derived from
the token, :func:`shared.settings.api_token.cookie_value`) and the page goes on to ``/``. The API then takes the cookie as
it takes ``Authorization: Bearer``. A page on another site cannot use it: its requests are refused by
:mod:`adapters.web.origins` before anything else, and a browser does not even attach a ``SameSite=Strict``
cookie to a request another site starts.

**Token prefix** for clients that send no token (TinyAGI's TinyOffice, given ``http://host:3777/t/<token>``
as its API base URL): :class:`TokenPrefix` strips ``/t/<token>`` from HTTP and WebSocket paths, marking the
request as carrying the token when it matches (constant-time) and answering 401 (a WebSocket: closed before
it is accepted) when it does not.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse
from pydantic import Field
from starlette.types import ASGIApp, Receive, Scope, Send

from shared.settings.api_token import cookie_name, cookie_value

from .auth import PREFIX_AUTHENTICATED, server_port, token_matches
from .errors import ApiError
from .health_routes import PAGE_HEADERS, STATIC_DIR
from .params import Body
from .state import Web

PREFIX = "/t/"
#: How long a browser stays signed in (it signs in again with the link `agentpost up` or `token` prints).
COOKIE_MAX_AGE = 30 * 86400
WRONG_TOKEN = "this address carries a wrong API token; `agentpost token` prints the right base URL"


class TokenPrefix:
    """ASGI middleware for ``/t/<token>/…`` (see the module docstring). ``token`` is the one in force; with
    none (open loopback) a prefix is refused too, as it names a token the server does not have."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] not in ("http", "websocket") or not path.startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        given, slash, rest = path[len(PREFIX) :].partition("/")
        if not self.token or not token_matches(given, self.token):
            await _refuse(scope, send)
            return
        inner = slash + rest or "/"
        raw = scope.get("raw_path")
        scope = {**scope, "path": inner, PREFIX_AUTHENTICATED: True}
        if isinstance(raw, bytes):
            # The raw path keeps its own percent-encoding: drop its first two segments (``/t/<token>``).
            parts = raw.split(b"/", 3)
            scope["raw_path"] = b"/" + parts[3] if len(parts) == 4 else b"/"
        await self.app(scope, receive, send)


async def _refuse(scope: Scope, send: Send) -> None:
    if scope["type"] == "websocket":
        # Closing before accepting makes the server answer the handshake with 403.
        await send({"type": "websocket.close", "code": 4401, "reason": "wrong API token"})
        return
    body = json.dumps({"error": WRONG_TOKEN}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


# -- the sign-in page -----------------------------------------------------------------------------------------
router = APIRouter()


class SignInIn(Body):
    token: str = Field(min_length=1, max_length=4096)


@router.get("/signin", include_in_schema=False)
async def signin_page() -> FileResponse:
    return FileResponse(STATIC_DIR / "signin.html", headers=PAGE_HEADERS)


@router.post("/signin", summary="Exchange the API token for the dashboard's sign-in cookie", status_code=204)
async def signin(body: SignInIn, request: Request, web: Web) -> Response:
    if not web.token:
        raise ApiError(400, "this server asks for no token (api.allow_open_loopback): open / directly")
    if not token_matches(body.token, web.token):
        raise ApiError(401, "that sign-in link holds a wrong token; `agentpost token` prints the right one")
    response = Response(status_code=204)
    response.set_cookie(
        cookie_name(server_port(request)),
        cookie_value(web.token),
        max_age=COOKIE_MAX_AGE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response
