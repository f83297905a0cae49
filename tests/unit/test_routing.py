"""Tests for shared.settings.routing: examples for each behaviour, then hypothesis properties."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.settings.routing import (
    AGENT_NAME_RE,
    HandoffTag,
    Route,
    Team,
    is_valid_name,
    parse_file_refs,
    parse_handoff_tags,
    parse_send_files,
    render_for_user,
    render_partial_reply,
    resolve_route,
    strip_send_file_tags,
    validate_name,
)

pytestmark = pytest.mark.unit

AGENTS = ("coder", "writer", "reviewer", "assistant")
TEAMS = {"dev": Team(name="dev", agents=("coder", "reviewer"), leader="reviewer")}


def route(text: str, requested: str | None = None) -> Route:
    return resolve_route(text, AGENTS, TEAMS, "assistant", requested)


# --------------------------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["a", "0", "coder", "code-review_2", "a" * 32, "9lives", "a-", "a_"])
def test_valid_names(name: str) -> None:
    assert is_valid_name(name)
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "Coder", "-a", "_a", "a" * 33, "a b", "a/b", "..", "a.b", "coder\n", "\ncoder", "é", "a\x00"],
)
def test_invalid_names(name: str) -> None:
    assert not is_valid_name(name)
    with pytest.raises(ValueError, match="invalid team name") as info:
        validate_name(name, "team")
    message = str(info.value)
    assert repr(name) in message  # names the bad value
    assert AGENT_NAME_RE.pattern in message  # and the rule


def test_is_valid_name_rejects_non_strings() -> None:
    assert not is_valid_name(None)  # type: ignore[arg-type]
    assert not is_valid_name(7)  # type: ignore[arg-type]


def test_team_validates_itself() -> None:
    team = Team(name="dev", agents=["a", "b"], leader="a")  # type: ignore[arg-type]
    assert team.agents == ("a", "b")
    with pytest.raises(ValueError, match="leader 'c' is not one of its agents"):
        Team(name="dev", agents=("a", "b"), leader="c")
    with pytest.raises(ValueError, match="invalid team name 'Dev'"):
        Team(name="Dev", agents=("a",), leader="a")
    with pytest.raises(ValueError, match="has no agents"):
        Team(name="dev", agents=(), leader="a")
    with pytest.raises(ValueError, match="invalid agent"):
        Team(name="dev", agents=("a", "B"), leader="a")


# --------------------------------------------------------------------------------------------- routing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("@coder fix the bug", Route("coder", None, True)),
        ("  @coder fix the bug", Route("coder", None, True)),
        ("\n@Coder: fix", Route("coder", None, True)),
        ("@CODER, please", Route("coder", None, True)),
        ("@writer", Route("writer", None, True)),
        ("@dev ship it", Route("reviewer", "dev", True)),
        ("@DEV: ship it", Route("reviewer", "dev", True)),
        ("@nobody hello", Route("assistant", None, False)),
        ("hello @coder", Route("assistant", None, False)),
        ("@coder's idea", Route("assistant", None, False)),
        ("@coder.", Route("assistant", None, False)),
        ("email@coder hi", Route("assistant", None, False)),
        ("@ coder", Route("assistant", None, False)),
        ("", Route("assistant", None, False)),
        ("just text", Route("assistant", None, False)),
    ],
)
def test_resolve_route_mentions(text: str, expected: Route) -> None:
    assert route(text) == expected


def test_requested_agent_wins_when_known() -> None:
    assert route("@coder hi", requested="writer") == Route("writer", None, True)
    assert route("hi", requested="Writer") == Route("writer", None, True)
    assert route("hi", requested="dev") == Route("reviewer", "dev", True)
    # An unknown requested agent is ignored: the mention (or default) decides.
    assert route("@coder hi", requested="ghost") == Route("coder", None, True)
    assert route("hi", requested="ghost") == Route("assistant", None, False)
    assert route("hi", requested="") == Route("assistant", None, False)


def test_agent_wins_over_team_of_same_name() -> None:
    teams = {"coder": Team(name="coder", agents=("writer",), leader="writer")}
    assert resolve_route("@coder x", AGENTS, teams, "assistant") == Route("coder", None, True)


def test_team_whose_leader_is_unknown_falls_back() -> None:
    teams = {"ops": Team(name="ops", agents=("ghost",), leader="ghost")}
    assert resolve_route("@ops x", AGENTS, teams, "assistant") == Route("assistant", None, False)


def test_default_agent_must_be_known() -> None:
    with pytest.raises(ValueError, match="default agent 'ghost'"):
        resolve_route("hi", AGENTS, TEAMS, "ghost")


def test_routing_keeps_the_text() -> None:
    text = "@coder fix the bug"
    route(text)
    assert text == "@coder fix the bug"


# --------------------------------------------------------------------------------------------- handoff tags


def test_single_agent_tag() -> None:
    reply = "Sure. [@coder: please fix the login bug] Done."
    assert parse_handoff_tags(reply) == [
        HandoffTag("agent", ("coder",), "please fix the login bug", 6, 40),
    ]
    assert reply[6:40] == "[@coder: please fix the login bug]"


def test_multiple_targets_and_team() -> None:
    reply = "[@a,b: one]\n[@Coder , Writer: two]\n[#dev: three]"
    tags = parse_handoff_tags(reply)
    assert [(t.kind, t.targets, t.text) for t in tags] == [
        ("agent", ("a", "b"), "one"),
        ("agent", ("coder", "writer"), "two"),
        ("team", ("dev",), "three"),
    ]
    for tag in tags:
        assert reply[tag.start] == "[" and reply[tag.end - 1] == "]"


def test_duplicate_targets_are_merged() -> None:
    assert parse_handoff_tags("[@a, b, A: x]")[0].targets == ("a", "b")


def test_nested_brackets_in_body() -> None:
    reply = "[@a: see [docs] and [x[y]]] after"
    (tag,) = parse_handoff_tags(reply)
    assert tag.text == "see [docs] and [x[y]]"
    assert reply[tag.end :] == " after"


def test_tag_inside_a_body_belongs_to_the_body() -> None:
    (tag,) = parse_handoff_tags("[@a: tell [@b: hi] please]")
    assert tag.targets == ("a",)
    assert tag.text == "tell [@b: hi] please"


def test_multiline_body_and_whitespace_stripped() -> None:
    (tag,) = parse_handoff_tags("[@a:\n  line one\n  line two\n]")
    assert tag.text == "line one\n  line two"


def test_empty_body_is_still_a_tag() -> None:
    (tag,) = parse_handoff_tags("[@a:]")
    assert tag.text == ""
    assert render_for_user("x [@a:] y") == "x → @a: y"


@pytest.mark.parametrize(
    "reply",
    [
        "[@a: unclosed",
        "[@a: see [docs] and more",
        "[@a: [x]",
        "[@ a: space after at]",
        "[@a : space before colon]",
        "[@a,: trailing comma]",
        "[@,a: leading comma]",
        "[@_a: bad name]",
        "[@" + "a" * 33 + ": too long]",
        "[@a.b: bad char]",
        "[#a,b: one room only]",
        "[@a no colon]",
        "[ @a: space after bracket]",
        "@a: no bracket]",
        "[a: no sigil]",
        "[@\u212a: kelvin sign lowercases to k]",
        "[@a,\nb: newline around comma]",
    ],
)
def test_not_tags(reply: str) -> None:
    assert parse_handoff_tags(reply) == []
    assert render_for_user(reply) == reply


def test_unbalanced_outer_does_not_hide_inner_tag() -> None:
    reply = "[@a: open [@b: closed]"
    assert [t.targets for t in parse_handoff_tags(reply)] == [("b",)]
    assert render_for_user(reply) == "[@a: open → @b: closed"


def test_stray_closing_brackets_are_plain_text() -> None:
    reply = "] ] [@a: x] ]"
    (tag,) = parse_handoff_tags(reply)
    assert (tag.text, tag.start, tag.end) == ("x", 4, 11)
    assert render_for_user(reply) == "] ] → @a: x ]"


@pytest.mark.parametrize(
    ("reply", "rendered"),
    [
        ("[@a: hi]", "→ @a: hi"),
        ("Hi.\n[@a,b: review it]\nBye.", "Hi.\n→ @a, @b: review it\nBye."),
        ("[#dev:   standup at 10  ]", "→ #dev: standup at 10"),
        ("[@A: see [docs]]", "→ @a: see [docs]"),
        ("[@a: ask [@b: about [x]]]", "→ @a: ask → @b: about [x]"),
        ("no tags [here]", "no tags [here]"),
        ("", ""),
    ],
)
def test_render_for_user(reply: str, rendered: str) -> None:
    assert render_for_user(reply) == rendered


def test_parser_is_linear_on_many_unclosed_heads() -> None:
    # Quadratic scanning would take minutes here; the timeout in pyproject would catch it.
    reply = "[@a: " * 50_000
    assert parse_handoff_tags(reply) == []
    assert render_for_user(reply) == reply


# --------------------------------------------------------------------------------------------- files


def test_parse_file_refs() -> None:
    text = "look [file: /home/u/.agentpost/files/a b.png] and [FILE:/tmp/x.txt ] [file:   ] [send_file: no]"
    assert parse_file_refs(text) == ["/home/u/.agentpost/files/a b.png", "/tmp/x.txt"]


def test_parse_send_files() -> None:
    reply = "Here: [send_file: out/report.pdf]\n[send_file:/abs/chart.png]\n[send_file: ] [file: /x]"
    assert parse_send_files(reply) == ["out/report.pdf", "/abs/chart.png"]


@pytest.mark.parametrize(
    ("reply", "stripped"),
    [
        ("no tags\n\n  kept as is  ", "no tags\n\n  kept as is  "),
        ("Here it is.\n[send_file: a.png]", "Here it is."),
        ("Here it is.\n\n[send_file: a.png]\n", "Here it is."),
        ("A\n\n[send_file: a.png]\n\nB", "A\n\nB"),
        ("A\n[send_file: a]\n[send_file: b]\nB", "A\nB"),
        ("See [send_file: a.png] here", "See here"),
        ("See [send_file: a.png].", "See."),
        ("  [send_file: a.png] first", "first"),
        ("[send_file: a] [send_file: b]\ntext", "text"),
        ("A\r\n[send_file: a]\r\nB\r\n", "A\r\nB"),
        ("[send_file: ] stays", "[send_file: ] stays"),
    ],
)
def test_strip_send_file_tags(reply: str, stripped: str) -> None:
    assert strip_send_file_tags(reply) == stripped


# --------------------------------------------------------------------------------------------- properties

names = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,31}", fullmatch=True)


@st.composite
def cased(draw: st.DrawFn, name: str) -> str:
    """``name`` with a random mix of upper and lower case, as an agent or user might write it."""
    flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
    return "".join(c.upper() if flip else c for c, flip in zip(name, flips, strict=True))


@st.composite
def route_setups(draw: st.DrawFn) -> tuple[list[str], dict[str, Team], str]:
    agents = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    team_names = draw(st.lists(names, max_size=3, unique=True))
    teams: dict[str, Team] = {}
    for team_name in team_names:
        members = draw(st.lists(st.sampled_from(agents), min_size=1, max_size=3, unique=True))
        teams[team_name] = Team(team_name, tuple(members), draw(st.sampled_from(members)))
    return agents, teams, draw(st.sampled_from(agents))


@given(setup=route_setups(), text=st.text(), requested=st.none() | st.text() | names)
def test_route_always_names_a_known_agent_and_keeps_text(
    setup: tuple[list[str], dict[str, Team], str], text: str, requested: str | None
) -> None:
    agents, teams, default = setup
    before = str(text)
    result = resolve_route(text, agents, teams, default, requested)
    assert result.agent in agents
    assert text == before
    if result.team is not None:
        assert result.team in teams and result.agent == teams[result.team].leader
    if not result.explicit:
        assert result.agent == default and result.team is None


@given(
    setup=route_setups(),
    data=st.data(),
    lead=st.sampled_from(["", " ", "\n\t "]),
    sep=st.sampled_from([" ", ": ", ",", "\n", ""]),
    rest=st.text(),
)
def test_mention_of_a_known_agent_routes_there(
    setup: tuple[list[str], dict[str, Team], str], data: st.DataObject, lead: str, sep: str, rest: str
) -> None:
    agents, teams, default = setup
    name = data.draw(st.sampled_from(agents))
    written = data.draw(cased(name))
    text = f"{lead}@{written}{sep}{rest}" if sep else f"{lead}@{written}"
    assert resolve_route(text, agents, teams, default) == Route(name, None, True)


@given(setup=route_setups(), data=st.data(), rest=st.text())
def test_mention_of_a_team_routes_to_its_leader(
    setup: tuple[list[str], dict[str, Team], str], data: st.DataObject, rest: str
) -> None:
    agents, teams, default = setup
    candidates = [t for t in teams if t not in agents]
    if not candidates:
        return
    team = data.draw(st.sampled_from(candidates))
    result = resolve_route(f"@{team} {rest}", agents, teams, default)
    assert result == Route(teams[team].leader, team, True)


# Plain text and body text: no brackets, so they can never form or break a tag. Bodies also avoid "@"/"#"
# so the only tag syntax in a generated reply is the tags we put there.
plain = st.text(st.characters(exclude_characters="[]", exclude_categories=["Cs"]), max_size=30)
body_leaf = st.text(st.characters(exclude_characters="[]@#", exclude_categories=["Cs"]), max_size=15)


@dataclass(frozen=True)
class Built:
    """A generated piece of reply: its raw text, how it renders, and the top-level tags in it."""

    raw: str
    rendered: str
    tags: tuple[tuple[str, tuple[str, ...], str], ...] = ()


def concat(parts: list[Built]) -> Built:
    return Built("".join(p.raw for p in parts), "".join(p.rendered for p in parts))


@st.composite
def tag_strategy(draw: st.DrawFn, body: st.SearchStrategy[Built]) -> Built:
    kind = draw(st.sampled_from(["agent", "team"]))
    # Several recipients for a direct message; a chat-room post goes to exactly one team.
    targets = draw(st.lists(names, min_size=1, max_size=4)) if kind == "agent" else [draw(names)]
    written = [draw(cased(t)) for t in targets]
    seps = [draw(st.sampled_from([",", ", ", " ,", " \t, "])) for _ in written[1:]]
    target_list = written[0] + "".join(s + w for s, w in zip(seps, written[1:], strict=True))
    inner = draw(body)
    sigil = "@" if kind == "agent" else "#"
    raw = f"[{sigil}{target_list}:{inner.raw}]"
    unique = tuple(dict.fromkeys(targets))
    head = "→ " + ", ".join(sigil + t for t in unique) + ":"
    text = inner.rendered.strip()
    rendered = f"{head} {text}" if text else head
    return Built(raw, rendered, ((kind, unique, inner.raw.strip()),))


# A body is a mix of plain text, balanced bracket groups and nested tags, to any depth.
bodies: st.SearchStrategy[Built] = st.recursive(
    body_leaf.map(lambda s: Built(s, s)),
    lambda children: st.one_of(
        st.lists(children, max_size=4).map(concat),
        children.map(lambda c: Built(f"[{c.raw}]", f"[{c.rendered}]")),
        tag_strategy(children),
    ),
    max_leaves=12,
)


@st.composite
def replies(draw: st.DrawFn) -> Built:
    first = draw(plain)
    pieces = [Built(first, first)]
    for _ in range(draw(st.integers(0, 5))):
        pieces.append(draw(tag_strategy(bodies)))
        text = draw(plain)
        pieces.append(Built(text, text))
    return Built(
        "".join(p.raw for p in pieces),
        "".join(p.rendered for p in pieces),
        tuple(t for p in pieces for t in p.tags),
    )


@settings(max_examples=300)
@given(reply=replies())
def test_generated_tags_are_found_in_order_and_rendered(reply: Built) -> None:
    tags = parse_handoff_tags(reply.raw)
    assert [(t.kind, t.targets, t.text) for t in tags] == list(reply.tags)
    for tag in tags:
        assert reply.raw[tag.start] == "[" and reply.raw[tag.end - 1] == "]"
    rendered = render_for_user(reply.raw)
    assert rendered == reply.rendered
    assert "[@" not in rendered and "[#" not in rendered


@given(reply=replies())
def test_removing_a_tags_closing_bracket_unmakes_it(reply: Built) -> None:
    # Drop the final "]" of the last top-level tag: that tag must disappear; earlier ones stay.
    tags = parse_handoff_tags(reply.raw)
    if not tags:
        return
    last = tags[-1]
    broken = reply.raw[: last.end - 1] + reply.raw[last.end :]
    found = parse_handoff_tags(broken)
    assert found[: len(tags) - 1] == tags[:-1]
    assert all(t.start != last.start for t in found)


def balanced(segment: str) -> bool:
    depth = 0
    for char in segment:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


# Arbitrary text, biased towards the pieces tags are made of so that near-misses are common.
tag_fragments = st.sampled_from(
    [
        "[@",
        "[#",
        "[",
        "]",
        ":",
        ",",
        " , ",
        " ",
        "\n",
        "a",
        "B",
        "_",
        "-",
        "0",
        "é",
        "\u212a",
        "coder",
        "[file:",
        "[@a:",
        "[#b:",
        "[@a, C:",
        "[@_x:",
        "[#a,b:",
    ]
)
tag_like_text = st.lists(tag_fragments, max_size=30).map("".join) | st.text(max_size=60)


@settings(max_examples=500)
@given(reply=tag_like_text)
def test_arbitrary_text_never_crashes_and_tags_are_well_formed(reply: str) -> None:
    tags = parse_handoff_tags(reply)
    previous_end = 0
    for tag in tags:
        assert previous_end <= tag.start < tag.end <= len(reply)
        previous_end = tag.end
        segment = reply[tag.start : tag.end]
        assert segment[:2] in ("[@", "[#") and segment.endswith("]")
        assert balanced(segment)
        assert tag.targets and all(is_valid_name(t) for t in tag.targets)
        assert tag.text == tag.text.strip()
    rendered = render_for_user(reply)
    # Rendering removes all recognisable tags and never invents new ones.
    assert parse_handoff_tags(rendered) == []
    if not tags:
        assert rendered == reply
    parse_file_refs(reply)
    parse_send_files(reply)
    strip_send_file_tags(reply)


@given(reply=tag_like_text.map(lambda s: s.replace("]", "")))
def test_unbalanced_brackets_never_produce_a_tag(reply: str) -> None:
    assert parse_handoff_tags(reply) == []
    assert render_for_user(reply) == reply


@given(
    sigil=st.sampled_from(["@", "#"]),
    target=names,
    body=bodies.filter(lambda b: "[@" not in b.raw and "[#" not in b.raw),
    before=plain,
    after=plain,
)
def test_tag_missing_its_closing_bracket_is_plain_text(
    sigil: str, target: str, body: Built, before: str, after: str
) -> None:
    reply = f"{before}[{sigil}{target}:{body.raw}{after}"
    assert parse_handoff_tags(reply) == []
    assert render_for_user(reply) == reply


@given(name=st.text(max_size=40) | names | st.text(st.sampled_from(string.ascii_letters + "0123456789_-\n")))
def test_validate_name_accepts_exactly_the_rule(name: str) -> None:
    # An independent statement of the rule, to check the regex against.
    allowed = set(string.ascii_lowercase + string.digits + "_-")
    by_hand = 1 <= len(name) <= 32 and set(name) <= allowed and name[0] not in "_-"
    assert is_valid_name(name) == by_hand == (re.fullmatch(AGENT_NAME_RE.pattern, name) is not None)
    if by_hand:
        assert validate_name(name) == name
    else:
        with pytest.raises(ValueError, match=re.escape(repr(name))):
            validate_name(name)


@given(
    paths=st.lists(st.from_regex(r"/[a-zA-Z0-9._/ -]{0,20}[a-zA-Z0-9]", fullmatch=True), max_size=4),
    glue=plain,
)
def test_send_file_tags_round_trip(paths: list[str], glue: str) -> None:
    reply = glue + "".join(f"\n[send_file: {p}]" for p in paths)
    assert parse_send_files(reply) == paths
    stripped = strip_send_file_tags(reply)
    assert parse_send_files(stripped) == []
    assert "[send_file:" not in stripped


# --------------------------------------------------------------------------------------------- a reply being written


@pytest.mark.parametrize(
    ("so_far", "shown"),
    [
        ("Plain text, no tags", "Plain text, no tags"),
        ("Asking: [@mate: check this]", "Asking: → @mate: check this"),
        ("Posting: [#dev: hello]", "Posting: → #dev: hello"),
        ("Notes:\n[send_file: notes.txt]\nDone", "Notes:\nDone"),
        # A tag still being written is left out until it is closed.
        ("Asking: [", "Asking: "),
        ("Asking: [@", "Asking: "),
        ("Asking: [@ma", "Asking: "),
        ("Asking: [@mate, wr", "Asking: "),
        ("Asking: [@mate: check th", "Asking: "),
        ("Asking: [@mate: check line 3\nand [4", "Asking: "),
        ("Asking: [@mate: look [here] and", "Asking: "),
        ("Posting: [#dev: hel", "Posting: "),
        ("Notes: [send_fi", "Notes: "),
        ("Notes: [SEND_FILE: notes.t", "Notes: "),
        ("Done: [@a: x] and [@b: y", "Done: → @a: x and "),
        # What can never become a tag shows as the final shows it: as written.
        ("See [1] and [2", "See [1] and [2"),
        ("A list [see below", "A list [see below"),
        ("[#dev,ops: not a room post", "[#dev,ops: not a room post"),
        ("[@-x: not a name", "[@-x: not a name"),
        ("[send_file: a path\nbroken by a line", "[send_file: a path\nbroken by a line"),
    ],
)
def test_render_partial_reply(so_far: str, shown: str) -> None:
    assert render_partial_reply(so_far) == shown


@st.composite
def replies_with_files(draw: st.DrawFn) -> str:
    """A generated reply (:func:`replies`) with send_file tags between its pieces."""
    reply = draw(replies()).raw
    path = st.from_regex(r"[a-zA-Z0-9._/-][a-zA-Z0-9._/ -]{0,15}", fullmatch=True)
    for _ in range(draw(st.integers(0, 2))):
        cut = draw(st.integers(0, len(reply)))
        if render_partial_reply(reply[:cut]) != render_for_user(reply[:cut]):
            continue  # inside a tag: a send_file tag goes between tags only
        keyword = draw(st.sampled_from(["send_file", "SEND_FILE", "Send_File"]))
        reply = f"{reply[:cut]}\n[{keyword}: {draw(path)}]\n{reply[cut:]}"
    return reply


@settings(max_examples=200)
@given(reply=replies_with_files())
def test_a_reply_written_so_far_never_shows_tag_syntax_and_ends_as_the_final(reply: str) -> None:
    for end in range(len(reply) + 1):
        shown = render_partial_reply(reply[:end])
        assert "[@" not in shown and "[#" not in shown and "[send_file" not in shown.lower(), (end, shown)
    assert render_partial_reply(reply) == render_for_user(strip_send_file_tags(reply))
