"""What a chat user reads when their message did not get an answer: the words, written once.

Every text says what happened, which agent, what the user can do (send it again, ``/retry``, ``/reset``) and
a short reference the operator can look up with ``agentpost trace``. No internal terms: no "dead letter",
no "lease", no error codes without words around them.
"""

from __future__ import annotations

import math


def _quoted(agent: str) -> str:
    return f"“{agent}”" if agent else "the agent"


def retry_note(agent: str, attempt: int, max_attempts: int, wait_ms: int, what: str) -> str:
    """The one note a chat sees while its message is being retried (edited in place on each attempt)."""
    seconds = max(1, math.ceil(wait_ms / 1000))
    return (
        f"{_quoted(agent) if agent else 'The agent'} hit a problem ({what}) — trying again "
        f"in {seconds} s (attempt {attempt + 1} of {max_attempts})."
    )


def gave_up_notice(
    agent: str, what: str, ref: str, *, attempts: int, permanent: bool, advice: str = ""
) -> str:
    """The one reply a chat gets when its message will not be answered (it is kept for the operator)."""
    if permanent:
        head = f"Sorry — {_quoted(agent)} could not answer your message: {what}."
        todo = advice or "Sending the same message again will fail the same way; change it, or type /reset."
    else:
        tries = f"after {attempts} tries" if attempts > 1 else ""
        head = f"Sorry — {_quoted(agent)} could not answer your message {tries}: {what}.".replace("  ", " ")
        todo = advice or "Type /retry to try it again, or send it again later."
    return f"{head} {todo} (ref {ref})"


def teammate_gave_up_notice(
    agent: str,
    handed_by: str,
    what: str,
    ref: str,
    *,
    attempts: int,
    permanent: bool,
    advice: str = "",
    can_retry: bool = True,
) -> str:
    """The one notice the chat a chain started from gets when a teammate's part of it will not be done:
    the work ``handed_by`` gave ``agent`` failed for good (it is kept for the operator). ``can_retry``: the
    chat's ``/retry`` reaches it (a handoff does, a chat-room post does not)."""
    by = f" that {_quoted(handed_by)} handed to it" if handed_by else ""
    tries = f" after {attempts} tries" if attempts > 1 and not permanent else ""
    head = f"Sorry — {_quoted(agent)} could not do its part of your request{by}{tries}: {what}."
    if advice and (can_retry or "/retry" not in advice):
        todo = advice
    elif permanent:
        todo = (
            "Trying it again would fail the same way; ask in other words, or ask the operator to look it up."
        )
    elif can_retry:
        todo = f"Type /retry to have {_quoted(agent)} try its part again, or send your request again later."
    else:
        todo = "Send your request again later to have another go."
    return f"{head} The other agents' answers do not include it. {todo} (ref {ref})"


def _names(agents: list[str]) -> str:
    """``“a”``, ``“a” and “b”``, ``“a”, “b” and “c”``."""
    quoted = [_quoted(a) for a in agents] or ["a teammate"]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def handoff_refused_notice(agent: str, targets: list[str], max_hops: int, ref: str) -> str:
    """The one notice a chat gets when its request went from agent to agent ``max_hops`` times and
    ``agent`` may not hand it on again (to ``targets``)."""
    times = "once" if max_hops == 1 else f"{max_hops} times"
    return (
        f"{_quoted(agent)} wanted to hand your request on to {_names(targets)}, but it has already been "
        f"handed from agent to agent {times}, which is as far as one request may go, so that part was not "
        f"passed on. The answers so far are above; send a new message to carry on. (ref {ref})"
    )


def chain_budget_notice(agent: str, targets: list[str], max_runs: int, ref: str) -> str:
    """The one notice a chat gets when the agents have spent the runs its message may set off, and the
    work ``agent`` handed to ``targets`` was not passed on."""
    return (
        f"The agents have used up the {max_runs} runs one message may set off, so the work {_quoted(agent)} "
        f"handed to {_names(targets)} was not passed on, and they stopped handing your request on to each other. Their "
        f"answers so far are above; send a new message to carry on. (ref {ref})"
    )


def busy_note(agent: str, policy: str, *, same_chat: bool) -> str:
    """The one note a chat gets when its message waits behind a run of ``agent`` (once per run and chat).

    ``policy`` is how the chat's message will be handled (``collect``, ``followup``, ``interrupt``; a
    ``steer`` message that cannot join the run going on waits as under ``collect``); ``same_chat`` says
    whether the run going on answers this chat's earlier message or another conversation.
    """
    who = _quoted(agent)
    if same_chat and policy == "interrupt":
        return f"Got it — stopping {who}'s current run to include this message."
    if same_chat:
        head = f"Queued: {who} is still working on your previous message."
    else:
        head = f"Queued: {who} is busy with another conversation."
    if policy in ("collect", "steer"):
        how = "together with anything else you send meanwhile, after the current run"
    elif policy == "followup":
        how = "after the current run, each of your messages in turn"
    else:
        how = "after the current run"
    return f"{head} This will be answered {how}."


def steered_note(agent: str) -> str:
    """The note a chat gets when its message was handed to the run going on in that chat (``steer``)."""
    return (
        f"Added to what {_quoted(agent)} is working on now: it will take this into account, and its reply "
        "will answer this message too."
    )
