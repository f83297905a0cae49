"""The busy policy's pure parts: arrivals merged into work groups by policy, the cap, the prompts of
carried and crashed runs, the note a waiting chat gets."""

from __future__ import annotations

import pytest

from shared.notices import busy_note
from shared.queue.core import QueuedMessage
from tests.queued import claimed_message
from workers.busy import WorkGroup, apply_cap, build_prompt, merge_arrivals

pytestmark = pytest.mark.unit


def _msg(n: int, conversation: str, text: str = "", last_error: str | None = None) -> QueuedMessage:
    return claimed_message(n, conversation=conversation, text=text, last_error=last_error)


def test_merge_by_policy_and_cap_drops_the_oldest() -> None:
    groups: list[WorkGroup] = []
    policies = {("telegram", "a"): "collect", ("telegram", "b"): "followup"}
    merge_arrivals(groups, [_msg(1, "a"), _msg(2, "b"), _msg(3, "b")], policies.__getitem__)  # type: ignore[arg-type]
    merge_arrivals(groups, [_msg(4, "a"), _msg(5, "b")], policies.__getitem__)  # type: ignore[arg-type]
    assert [g.ids for g in groups] == [
        ["m_00000001", "m_00000004"],
        ["m_00000002"],
        ["m_00000003"],
        ["m_00000005"],
    ]
    dropped = apply_cap(groups, 2)
    assert [[m.message_id for m in batch] for batch in dropped] == [["m_00000002"]]
    assert [g.ids for g in groups] == [["m_00000001", "m_00000004"], ["m_00000003"], ["m_00000005"]]


def test_prompts_for_interrupted_and_crashed_runs() -> None:
    carried = build_prompt([_msg(1, "a", "old ask"), _msg(2, "a", "new ask")], carried=1)
    assert carried.index("old ask") < carried.index("The new messages") < carried.index("new ask")
    crashed = build_prompt([_msg(1, "a", "do it", last_error="interrupted: the lease of worker w expired")])
    assert crashed.startswith("[Note from agentpost: your previous attempt") and crashed.endswith("do it")
    assert build_prompt([_msg(1, "a", "plain", last_error="claude exited with code 1")]) == "plain"


def test_the_busy_note_says_how_the_chats_policy_handles_the_waiting_message() -> None:
    same = {p: busy_note("coder", p, same_chat=True) for p in ("collect", "followup", "interrupt")}
    assert same["collect"] == (
        "Queued: “coder” is still working on your previous message. This will be answered together with "
        "anything else you send meanwhile, after the current run."
    )
    assert same["followup"].endswith("answered after the current run, each of your messages in turn.")
    assert same["interrupt"] == "Got it — stopping “coder”'s current run to include this message."
    # Another chat's run is never stopped for this one: it waits, whatever its policy.
    other = busy_note("coder", "interrupt", same_chat=False)
    assert (
        other
        == "Queued: “coder” is busy with another conversation. This will be answered after the current run."
    )
