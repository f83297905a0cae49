"""Helpers for the tests of questions in the chat (``permission_mode = "ask"``) on one platform: a request
made as a run makes it (:func:`shared.queue.approvals.ask`), for a message a chat sent."""

from __future__ import annotations

import json

from shared.chat.address import ChatAddress
from shared.queue import approvals
from shared.runtime import Runtime

COMMAND = "echo ran > marker.txt"


def ask_for_bash(
    rt: Runtime, chat: ChatAddress, message_id: str, *, command: str = COMMAND, timeout_ms: int = 600_000
) -> approvals.Approval:
    """The agent ``alpha`` asks ``chat`` whether it may run ``command`` with Bash (as a run of
    ``message_id`` would); the question is queued to the chat."""
    question = approvals.Question(
        agent="alpha",
        tool="Bash",
        summary=command,
        detail=json.dumps({"command": command}),
        pattern="echo ran *",
        message_id=message_id,
        run_id="",
        chat=chat,
        timeout_ms=timeout_ms,
    )
    return approvals.ask(rt.db, rt.queue.responses, question)


def status_of(rt: Runtime, approval_id: str) -> str:
    """The request's status now (``pending``, ``allowed`` …)."""
    found = approvals.get(rt.db, approval_id)
    assert found is not None, approval_id
    return str(found.status)
