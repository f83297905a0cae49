"""Request parameter rules shared by the routers: names, topics, cursors, and the base of request bodies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict

#: An agent, team or channel name as routes accept it.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
#: Cursors are checked by :func:`~adapters.web.stream.valid_cursor` (400 with a reason), not by a pattern
#: (a bare 422 "should match pattern" says nothing about the range); this only bounds the length.
CURSOR_MAX_LENGTH = 100
TOPIC_PATTERN = r"^[A-Za-z0-9_.:*-]{1,100}$"
CONSUMER_PATTERN = r"^[A-Za-z0-9_.:-]{1,100}$"

#: A name in the path (``/api/agents/{agent}``, ``/api/chatroom/{team}`` …).
Name = Annotated[str, PathParam(pattern=NAME_PATTERN)]


class Body(BaseModel):
    """A request body: unknown fields are ignored (clients send more than we read)."""

    model_config = ConfigDict(extra="ignore")
