"""``agentpost pairing list|approve CODE|revoke CHANNEL SENDER_ID``: manage who may talk to the agents."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from adapters import pairing
from shared.clock import now_ms
from shared.storage.statuses import PairingStatus


def _when(ms: int | None) -> str:
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def register(app: typer.Typer) -> None:
    """Add the ``pairing`` command group to the ``agentpost`` CLI."""
    from shared.cli.main import console, fail, print_json, runtime

    group = typer.Typer(help="Approve, list and revoke chat senders (pairing codes).", no_args_is_help=True)

    @group.command("list")
    def pairing_list(
        channel: Annotated[str | None, typer.Option(help="Only this channel.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
    ) -> None:
        """Pairings, newest first (pending codes that expired are marked)."""
        with runtime() as rt:
            rows = pairing.list_pairings(rt.db, channel)
        now = now_ms()
        items = [
            {
                "channel": p.channel,
                "sender_id": p.sender_id,
                "sender": p.sender,
                "code": p.code if p.status == PairingStatus.PENDING else "",
                "status": "expired" if p.expired(now) else p.status,
                "created_at": p.created_at,
                "approved_at": p.approved_at,
            }
            for p in rows
        ]
        if as_json:
            print_json(items)
            return
        if not items:
            console.print("no pairings")
            return
        table = Table("channel", "sender id", "sender", "status", "code", "requested", title="pairings")
        for item in items:
            table.add_row(
                str(item["channel"]),
                str(item["sender_id"]),
                str(item["sender"]),
                str(item["status"]),
                str(item["code"]),
                _when(int(str(item["created_at"]))),
            )
        console.print(table)

    @group.command("approve")
    def pairing_approve(
        code: Annotated[str, typer.Argument(help="The 8-character code the sender got.")],
    ) -> None:
        """Approve a pending pairing: the sender's messages go to the agents from now on."""
        with runtime() as rt:
            try:
                found = pairing.approve(rt.db, code)
            except pairing.PairingError as exc:
                raise fail(str(exc)) from None
        console.print(f"approved {found.sender or found.sender_id} ({found.sender_id}) on {found.channel}")

    @group.command("revoke")
    def pairing_revoke(
        channel: Annotated[str, typer.Argument(help="The channel, e.g. telegram.")],
        sender_id: Annotated[str, typer.Argument(help="The sender's id on that channel.")],
    ) -> None:
        """Revoke a sender: their next message needs a new pairing code and approval."""
        with runtime() as rt:
            try:
                pairing.revoke(rt.db, channel, sender_id)
            except pairing.PairingError as exc:
                raise fail(str(exc)) from None
        console.print(f"revoked {sender_id} on {channel}")

    app.add_typer(group, name="pairing")
