"""Message routing and reply tags: pure functions over strings, no I/O.

Two jobs live here:

* **Inbound routing** (``resolve_route``): which agent gets a user's message. A leading ``@agent`` or
  ``@team`` mention picks it; anything else goes to the default agent. The message text is never modified,
  so the agent sees exactly what the user wrote (seed 000 keeps the message intact too). A leading mention
  of a name that is neither (``unknown_mention``) is not routed at all: the sender addressed someone who is
  not here, so the queue refuses it and the chat answers with the names it knows.
* **Reply tags** in an agent's answer: handoffs (``[@a: text]``, ``[@a,b: text]``, ``[#team: text]``),
  inbound attachment references (``[file: /abs/path]``) and outbound attachments (``[send_file: path]``).

Everything is deliberately free of project imports so every process (workers, adapters, scheduler) can use
it, and so it can be tested exhaustively with property tests.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "AGENT_NAME_RE",
    "HandoffTag",
    "Route",
    "RouteTable",
    "Team",
    "is_valid_name",
    "parse_file_refs",
    "parse_handoff_tags",
    "parse_send_files",
    "render_for_user",
    "render_partial_reply",
    "resolve_route",
    "strip_send_file_tags",
    "unknown_mention",
    "validate_name",
]

# Agent and team names become folder names (workspace/<agent>/), so the rule must make path tricks
# ("..", "/", leading "-" or ".") impossible. Always apply it with ``fullmatch``: with ``match``/``search``
# a ``$`` also matches before a trailing newline, so "coder\n" would slip through.
AGENT_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")

_NAME_RULE = "1-32 characters of a-z, 0-9, '_' or '-', starting with a letter or digit"


def is_valid_name(name: str) -> bool:
    """Return True when ``name`` is a valid agent or team name (``AGENT_NAME_RE``, whole string)."""
    # Non-strings can arrive from loosely typed sources (JSON, TOML); answer False rather than raise.
    return isinstance(name, str) and AGENT_NAME_RE.fullmatch(name) is not None


def validate_name(name: str, kind: str = "agent") -> str:
    """Return ``name`` unchanged if it is valid, else raise ``ValueError`` naming the value and the rule.

    ``kind`` ("agent", "team", ...) only makes the message clearer. Names are not lowercased here:
    a stored name must already be canonical, and silently fixing it would hide a settings mistake.
    """
    if not is_valid_name(name):
        raise ValueError(f"invalid {kind} name {name!r}: must match {AGENT_NAME_RE.pattern} ({_NAME_RULE})")
    return name


@dataclass(frozen=True)
class Team:
    """A team: its members and the leader who receives messages addressed to ``@team``."""

    name: str
    agents: tuple[str, ...]
    leader: str

    def __post_init__(self) -> None:
        """Validate names and that the leader is a member, so a bad team fails where it is defined."""
        validate_name(self.name, "team")
        # Accept any iterable (e.g. a list from settings) but store a tuple so the team stays hashable.
        object.__setattr__(self, "agents", tuple(self.agents))
        if not self.agents:
            raise ValueError(f"team {self.name!r} has no agents")
        for agent in self.agents:
            validate_name(agent, f"agent (in team {self.name!r})")
        validate_name(self.leader, f"leader (of team {self.name!r})")
        if self.leader not in self.agents:
            raise ValueError(f"team {self.name!r}: leader {self.leader!r} is not one of its agents")


@dataclass(frozen=True)
class Route:
    """Where a message goes: the agent, the team it was addressed through (if any), and whether the
    sender chose it (``explicit``) or it fell back to the default agent."""

    agent: str
    team: str | None
    explicit: bool


# A mention is the first thing in the message (after optional whitespace) and must end at whitespace,
# ':' or ',' or the end of the text, so "@coder's idea" or "email@coder" never route. ASCII classes only:
# str.lower() maps some non-ASCII letters (e.g. the Kelvin sign) onto ASCII ones.
_MENTION_RE = re.compile(r"\s*@([A-Za-z0-9][A-Za-z0-9_-]*)(?=[\s:,]|\Z)")


class RouteTable:
    """Inbound routing for one set of agents and teams, its lookups built once (per settings change), so
    routing a message costs the same with 1 agent or 256.

    Raises ``ValueError`` if ``default_agent`` is not in ``agents`` (a configuration error: there would be
    no agent to fall back to).
    """

    def __init__(self, agents: Collection[str], teams: Mapping[str, Team], default_agent: str) -> None:
        if default_agent not in agents:
            raise ValueError(f"default agent {default_agent!r} is not a known agent")
        self.default_agent = default_agent
        # Lower-cased name → the route it gives, so the returned agent is always one of ``agents`` as
        # configured. An agent name wins over a team of the same name; a team whose leader is not an agent
        # routes nowhere.
        self._routes: dict[str, Route] = {}
        for name, team in teams.items():
            if team.leader in agents:
                self._routes[name.lower()] = Route(agent=team.leader, team=name, explicit=True)
        for agent in agents:
            self._routes[agent.lower()] = Route(agent=agent, team=None, explicit=True)
        self._known = frozenset(a.lower() for a in agents) | frozenset(t.lower() for t in teams)
        self._fallback = Route(agent=default_agent, team=None, explicit=False)

    def resolve(self, text: str, requested_agent: str | None = None) -> Route:
        """Decide which agent handles ``text``.

        Order: ``requested_agent`` (an API field) when it names a known agent or team; else a leading
        ``@name`` mention of a known agent or team (case-insensitive); else the default agent with
        ``explicit=False``. A team routes to its leader. The text itself is never changed: the mention
        stays in the message the agent reads.
        """
        if requested_agent is not None:
            route = self._routes.get(requested_agent.strip().lower())
            if route is not None:
                return route
        if "@" in text:
            match = _MENTION_RE.match(text)
            if match is not None:
                route = self._routes.get(match.group(1).lower())
                if route is not None:
                    return route
        return self._fallback

    def unknown_mention(self, text: str, known: Collection[str] = ()) -> str | None:
        """The name of ``text``'s leading ``@name`` mention when it names no agent, no team and nothing in
        ``known`` or :data:`RESERVED_MENTIONS` (case-insensitive), as written; else ``None``.

        Only a mention :meth:`resolve` would have read counts (first thing in the text, ending at
        whitespace, ``:``, ``,`` or the end), and only one that could be a name (the name rule, after
        lowercasing): "@coder's", "email@x" or "@" followed by a space are ordinary text.
        """
        match = _MENTION_RE.match(text) if "@" in text else None
        if match is None:
            return None
        name = match.group(1)
        key = name.lower()
        if not is_valid_name(key) or key in self._known or key in RESERVED_MENTIONS:
            return None
        return None if any(k.lower() == key for k in known) else name


def resolve_route(
    text: str,
    agents: Collection[str],
    teams: Mapping[str, Team],
    default_agent: str,
    requested_agent: str | None = None,
) -> Route:
    """:meth:`RouteTable.resolve` for a one-off lookup (a hot path keeps a :class:`RouteTable`)."""
    return RouteTable(agents, teams, default_agent).resolve(text, requested_agent)


#: Words after "@" that are not agent names but are still known: ``@default`` (back to normal routing).
RESERVED_MENTIONS = frozenset({"default"})


def unknown_mention(
    text: str, agents: Collection[str], teams: Mapping[str, Team], known: Collection[str] = ()
) -> str | None:
    """:meth:`RouteTable.unknown_mention` for a one-off check."""
    match = _MENTION_RE.match(text)
    if match is None:
        return None
    name = match.group(1)
    key = name.lower()
    if not is_valid_name(key):
        return None
    names = {n.lower() for n in agents} | {t.lower() for t in teams} | {k.lower() for k in known}
    return None if key in names or key in RESERVED_MENTIONS else name


@dataclass(frozen=True)
class HandoffTag:
    """A handoff tag found in a reply.

    ``kind`` is "agent" for ``[@a,b: text]`` (direct messages) or "team" for ``[#team: text]`` (a chat-room
    post). ``targets`` are lowercased, valid and without duplicates (first occurrence kept); ``text`` is the
    body with surrounding whitespace stripped (it may be empty; callers decide whether to send it);
    ``reply[start:end]`` is the whole tag including both brackets.
    """

    kind: Literal["agent", "team"]
    targets: tuple[str, ...]
    text: str
    start: int
    end: int


# The head of a tag: "[@" or "[#" immediately followed by the target list and ':'. Names are bounded to
# 32 characters so a failed match never backtracks far; the name rule itself is checked after lowercasing.
# Spaces/tabs (not newlines) are allowed around the commas.
_NAME_TOKEN = r"[A-Za-z0-9_-]{1,32}"
_TAG_HEAD_RE = re.compile(rf"\[(?P<sigil>[@#])(?P<targets>{_NAME_TOKEN}(?:[ \t]*,[ \t]*{_NAME_TOKEN})*):")
_TARGET_SPLIT_RE = re.compile(r"[ \t]*,[ \t]*")


@dataclass(frozen=True)
class _RawTag:
    """A recognised tag with the offsets render_for_user needs (body before stripping, closing bracket)."""

    tag: HandoffTag
    body_start: int  # first character of the stripped body
    body_end: int  # one past the last character of the stripped body
    close: int  # index of the closing "]"


def _matching_brackets(text: str) -> dict[int, int]:
    """Map the index of every balanced "[" to the index of its "]" in one pass.

    Precomputing this keeps parsing linear: scanning forward from each candidate tag would be quadratic on
    replies full of unclosed "[@a:" heads. Stray "]" with nothing open are ignored.
    """
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for index, char in enumerate(text):
        if char == "[":
            stack.append(index)
        elif char == "]" and stack:
            pairs[stack.pop()] = index
    return pairs


def _scan_tags(reply: str, *, nested: bool) -> Iterator[_RawTag]:
    """Yield recognised tags in order. With ``nested`` also tags inside other tags' bodies."""
    pairs: dict[int, int] | None = None
    pos = 0
    while True:
        head = _TAG_HEAD_RE.search(reply, pos)
        if head is None:
            return
        start = head.start()
        if pairs is None:
            pairs = _matching_brackets(reply)  # only paid for replies that look like they have tags
        close = pairs.get(start)
        raw_targets = _TARGET_SPLIT_RE.split(head.group("targets"))
        targets = tuple(dict.fromkeys(t.lower() for t in raw_targets))  # dedupe, keep order
        kind: Literal["agent", "team"] = "agent" if head.group("sigil") == "@" else "team"
        # A chat-room post goes to exactly one room; "[#a,b: ...]" is not a tag.
        valid = all(is_valid_name(t) for t in targets) and (kind == "agent" or len(raw_targets) == 1)
        if close is None or not valid:
            # Not a tag: it stays plain text. Resume right after "[" so a real tag inside it is still found.
            pos = start + 1
            continue
        body = reply[head.end() : close]
        stripped = body.strip()
        body_start = head.end() + (len(body) - len(body.lstrip()))
        body_end = body_start + len(stripped)
        tag = HandoffTag(kind=kind, targets=targets, text=stripped, start=start, end=close + 1)
        yield _RawTag(tag=tag, body_start=body_start, body_end=body_end, close=close)
        pos = head.end() if nested else close + 1


def parse_handoff_tags(reply: str) -> list[HandoffTag]:
    """Return the top-level handoff tags of ``reply`` in order.

    A tag is ``[@name: text]``, ``[@a, b: text]`` or ``[#team: text]``: the targets come right after
    ``[@``/``[#`` and end with ``:``; names are case-insensitive and must satisfy the name rule after
    lowercasing. The body runs to the matching ``]``, so it may contain balanced brackets (and even other
    tags, which then belong to the body and are delivered as text). A tag without its matching ``]`` or
    with an invalid name is not a tag.
    """
    return [raw.tag for raw in _scan_tags(reply, nested=False)]


def _render_head(tag: HandoffTag) -> str:
    """Readable form of a tag's head: "→ @a, @b:" or "→ #team:"."""
    sigil = "@" if tag.kind == "agent" else "#"
    return "→ " + ", ".join(sigil + target for target in tag.targets) + ":"


def render_for_user(reply: str) -> str:
    """Return ``reply`` with each handoff tag shown as readable text, everything else unchanged.

    ``[@a: hi]`` becomes ``→ @a: hi``, ``[@a,b: hi]`` ``→ @a, @b: hi`` and ``[#dev: hi]`` ``→ #dev: hi``.
    Tags nested in a tag's body are rendered too, so a user never sees raw tag syntax. Text that is not a
    tag (unbalanced, invalid name) is left exactly as written.
    """
    # Each tag becomes two non-overlapping edits (its head, its closing bracket), applied in one pass;
    # nested tags lie strictly inside the stripped body of their parent, so edits never overlap.
    edits: list[tuple[int, int, str]] = []
    for raw in _scan_tags(reply, nested=True):
        head = _render_head(raw.tag)
        if raw.tag.text:
            edits.append((raw.tag.start, raw.body_start, head + " "))
            edits.append((raw.body_end, raw.tag.end, ""))
        else:
            edits.append((raw.tag.start, raw.tag.end, head))
    if not edits:
        return reply
    edits.sort()
    parts: list[str] = []
    pos = 0
    for start, end, replacement in edits:
        parts.append(reply[pos:start])
        parts.append(replacement)
        pos = end
    parts.append(reply[pos:])
    return "".join(parts)


# Paths may contain spaces but not brackets or newlines: excluding "[" keeps each failed match bounded by
# the next bracket (linear time), and a tag never swallows the rest of the reply. Keywords are matched
# case-insensitively because agents sometimes capitalise them.
# A blank path is not a tag at all (so it is neither reported nor removed).
_FILE_REF_RE = re.compile(r"\[file:[ \t]*([^\[\]\s][^\[\]\n]*)\]", re.IGNORECASE)
_SEND_FILE_RE = re.compile(r"\[send_file:[ \t]*([^\[\]\s][^\[\]\n]*)\]", re.IGNORECASE)


def parse_file_refs(text: str) -> list[str]:
    """Return the paths of ``[file: /abs/path]`` references in ``text``, in order, stripped.

    Paths are returned as written; whether they are allowed (absolute, inside the files folder) is the
    caller's decision.
    """
    return [m.group(1).strip() for m in _FILE_REF_RE.finditer(text)]


def parse_send_files(reply: str) -> list[str]:
    """Return the paths of ``[send_file: path]`` tags in ``reply``, in order, stripped, as written.

    The caller must check each path is inside the agent's workspace or the files folder before sending.
    """
    return [m.group(1).strip() for m in _SEND_FILE_RE.finditer(reply)]


def _strip_line(line: str) -> str:
    """Remove send_file tags from one line, joining the remaining text with single spaces."""
    core, cr = (line[:-1], "\r") if line.endswith("\r") else (line, "")  # keep CRLF replies intact
    pieces = _SEND_FILE_RE.split(core)[::2]  # split() interleaves the captured paths; keep the text
    result = pieces[0].rstrip(" \t")
    for piece in pieces[1:]:
        rest = piece.lstrip(" \t")
        if not result.strip():
            result = ""  # the line started with a tag: drop the indentation left in front of it
        elif rest and rest[0] not in ".,;:!?)":
            result += " "  # one space between words, none before punctuation ("see [send_file: a].")
        result += rest
    return result + cr


def strip_send_file_tags(reply: str) -> str:
    """Return ``reply`` without its ``[send_file: path]`` tags (the files are sent as attachments).

    Lines that held only tags are removed, blank lines left next to each other by such a removal collapse
    to one, and the result is stripped at both ends. A reply without send_file tags is returned unchanged.
    """
    if not _SEND_FILE_RE.search(reply):
        return reply
    kept: list[str] = []
    dropped_since_kept = False
    for line in reply.split("\n"):
        if _SEND_FILE_RE.search(line):
            line = _strip_line(line)
            if not line.strip():
                dropped_since_kept = True
                continue
        elif not line.strip() and dropped_since_kept and kept and not kept[-1].strip():
            # A removed tag line sat between two blank lines: keep only one of them.
            continue
        kept.append(line)
        dropped_since_kept = False
    return "\n".join(kept).strip()


# -- a reply still being written ----------------------------------------------------------------------------
# What an unclosed "[" at the end of a streamed reply may still turn into: a handoff head being typed
# ("[@", "[@ma", "[@a, b"), a whole head whose body is still coming ("[@mate: half a sentence", which may
# run over lines and hold balanced brackets), or a send_file tag whose path is still coming (no newline or
# bracket in a path).
_HEAD_BEING_TYPED_RE = re.compile(rf"\[[@#](?:{_NAME_TOKEN}(?:[ \t]*,[ \t]*{_NAME_TOKEN})*[ \t]*,?[ \t]*)?")
_SEND_FILE_OPEN_RE = re.compile(r"\[send_file:[^\[\]\n]*", re.IGNORECASE)
_SEND_FILE_HEAD = "[send_file:"
_BRACKET_RE = re.compile(r"[\[\]]")


def _may_become_tag(tail: str) -> bool:
    """Whether ``tail`` (starting at an unclosed "[" and running to the end of the text so far) may still
    become a handoff or send_file tag as more text arrives."""
    if _SEND_FILE_HEAD.startswith(tail.lower()) or _SEND_FILE_OPEN_RE.fullmatch(tail):
        return True
    if _HEAD_BEING_TYPED_RE.fullmatch(tail):
        return True
    head = _TAG_HEAD_RE.match(tail)
    if head is None:
        return False
    raw_targets = _TARGET_SPLIT_RE.split(head.group("targets"))
    # As _scan_tags decides: a head with a name that breaks the rule, or a room post to several rooms,
    # never becomes a tag.
    return all(is_valid_name(t.lower()) for t in raw_targets) and (
        head.group("sigil") == "@" or len(raw_targets) == 1
    )


def _unfinished_tag_start(text: str) -> int:
    """Where an unfinished tag at the end of ``text`` starts (``len(text)`` when there is none): the first
    "[" with no matching "]" yet whose rest may still become a tag."""
    open_at: list[int] = []
    for bracket in _BRACKET_RE.finditer(text):  # a preview is rendered twice a second: skip plain text fast
        if bracket.group() == "[":
            open_at.append(bracket.start())
        elif open_at:
            open_at.pop()
    for start in open_at:  # outermost first: an unfinished tag holds any that open after it
        if _may_become_tag(text[start:]):
            return start
    return len(text)


def render_partial_reply(text: str) -> str:
    """Return the part of a reply written so far as its final will show it: send_file tags removed and
    handoff tags rendered as :func:`strip_send_file_tags` and :func:`render_for_user` do for the final, and
    a tag still being written at the end (``[@mate: half a sent``, ``[send_fi``) left out until it is
    closed, since it may yet become a tag the final renders or removes. A live preview never shows raw tag
    syntax that the final would not."""
    return render_for_user(strip_send_file_tags(text[: _unfinished_tag_start(text)]))
