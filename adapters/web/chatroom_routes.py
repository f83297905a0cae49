"""``/api/chatroom/{team}``: a team's chat room, read by TinyOffice and posted to by its users (every member
of the team gets the post as a message)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import Field

from shared.queue.records import MAX_MESSAGE_CHARS
from shared.reads import api_views

from .dialect import ChatMessageOut, ChatPosted
from .errors import ApiError
from .params import Body, Name
from .state import Web, WebState

router = APIRouter()


class ChatPostIn(Body):
    """``POST /api/chatroom/{team}``: a user's post to a team's chat room."""

    message: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    sender: str = Field(default="web", max_length=200)


def team_members(web: WebState, team: str) -> list[str]:
    """The agents of ``team`` (404 naming the known teams when there is no such team)."""
    teams = web.settings.teams
    if team not in teams:
        raise ApiError(404, f"no team {team!r} (known: {', '.join(sorted(teams)) or 'none'})")
    return list(teams[team].agents)


@router.get("/chatroom/{team}", summary="A team chat room's newest posts after ?since= (newest first)")
async def chatroom(
    team: Name,
    web: Web,
    since: Annotated[int, Query(ge=0, le=2**62)] = 0,
    after: Annotated[int | None, Query(ge=0, le=2**62, description="Same as since.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[ChatMessageOut]:
    team_members(web, team)
    rows = await web.run(
        api_views.chat_room_posts, web.db, team, since_id=max(since, after or 0), limit=limit
    )
    return [ChatMessageOut.from_row(r) for r in rows]


@router.post("/chatroom/{team}", status_code=201, summary="Post to a team chat room (every member is told)")
async def post_chatroom(team: Name, body: ChatPostIn, web: Web) -> ChatPosted:
    members = team_members(web, team)
    post = await web.run(api_views.post_to_chat_room, web.queue, team, body.sender, body.message, members)
    return ChatPosted(ok=True, id=post.id, queued=post.queued)
