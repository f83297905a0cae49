"""``agentpost approvals list|allow ID|deny ID``: answer agents that ask before a tool runs, as the operator.

An agent with ``permission_mode = "ask"`` asks the person in the chat first (:mod:`workers.approvals`); an
operator may answer any request from here too, at most once and only while it waits
(:func:`shared.queue.approvals.answer`). The chat sees the answer either way.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from shared.clock import now_ms
from shared.queue import approvals
from shared.queue.approvals import Choice


def _ago(ms: int, now: int) -> str:
    seconds = max(0, (now - ms) // 1000)
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ms else ""


def register(app: typer.Typer) -> None:
    """Add the ``approvals`` command group to the ``agentpost`` CLI."""
    from shared.cli.main import console, fail, print_json, runtime

    group = typer.Typer(
        help='Requests of agents that ask before a tool runs (permission_mode = "ask"): list, allow, deny.',
        no_args_is_help=True,
    )

    @group.command("list")
    def approvals_list(
        every: Annotated[
            bool, typer.Option("--all", help="Also the latest answered or expired ones.")
        ] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    ) -> None:
        """Requests waiting for an answer, oldest first (with --all: the latest 50, whatever became of them)."""
        with runtime() as rt:
            found = approvals.recent(rt.db) if every else approvals.waiting(rt.db)
        if as_json:
            print_json([a.as_dict() for a in found])
            return
        if not found:
            console.print("no request waits for an answer" if not every else "no requests yet")
            return
        now = now_ms()
        table = Table("id", "agent", "tool", "what", "chat", "asked", "status", title="approval requests")
        for a in found:
            left = f"{_ago(now, a.expires_at)} left" if a.waiting(now) else a.status
            what = " ".join(a.summary.split())
            table.add_row(
                a.id,
                a.agent,
                a.tool,
                what if len(what) <= 80 else what[:79] + "…",
                a.chat.label if a.chat.channel else "(no chat)",
                f"{_ago(a.created_at, now)} ago",
                left,
            )
        console.print(table)
        console.print("answer with: agentpost approvals allow ID  (or deny ID)")

    def _answer(approval_id: str, choice: Choice) -> None:
        with runtime() as rt:
            answered = approvals.answer(
                rt.db, rt.queue.responses, approval_id, choice, by="operator", via="cli"
            )
        if answered.outcome != "applied":
            raise fail(answered.text)
        console.print(answered.text)

    @group.command("allow")
    def approvals_allow(
        approval_id: Annotated[str, typer.Argument(help="The request's id (apr_…), from `approvals list`.")],
        for_chat: Annotated[
            bool,
            typer.Option(
                "--for-chat", help="Also allow the same tool and pattern for the rest of that chat."
            ),
        ] = False,
    ) -> None:
        """Allow a waiting request: the agent's tool runs."""
        _answer(approval_id, "chat" if for_chat else "allow")

    @group.command("deny")
    def approvals_deny(
        approval_id: Annotated[str, typer.Argument(help="The request's id (apr_…), from `approvals list`.")],
    ) -> None:
        """Deny a waiting request: the tool does not run; the agent goes on without it and says so."""
        _answer(approval_id, "deny")

    app.add_typer(group, name="approvals")
