"""An agent's questions in Discord (a part of :mod:`adapters.discord`): buttons under the question, and
presses of them taken from the gateway's component interactions.

- **Asking**: the question is sent with an action row of buttons (Allow: green, Deny: red, Allow for this
  chat: grey), each button's ``custom_id`` the :attr:`adapters.platform.Button.data` a press hands back.
- **Closing**: the question is edited to what became of it, its buttons removed (``components: []``).
- **Pressing**: an ``INTERACTION_CREATE`` of type 3 (a message component) becomes a
  :class:`adapters.platform.Press` in the chat (the channel id, as for messages) from the user who pressed.
  Discord wants an interaction answered within 3 seconds, and answering may wait on the database, so the
  interaction is deferred at once (privately, "thinking…") and the answer follows as an ephemeral message only
  the one who pressed sees.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from typing import Any

from adapters.platform import Button, Inbox, Press

with warnings.catch_warnings():
    # discord.py imports the stdlib audioop module, deprecated since Python 3.11.
    warnings.filterwarnings("ignore", message="'audioop' is deprecated", category=DeprecationWarning)
    import discord

#: A button's colour by the answer it gives (the part of its data after the last ``:``).
_STYLES = {
    "allow": discord.ButtonStyle.success,
    "deny": discord.ButtonStyle.danger,
    "chat": discord.ButtonStyle.secondary,
}


def question_view(buttons: Sequence[Button]) -> discord.ui.View:
    """The buttons of a question as a view to send with it (one row; Discord takes five per row).

    The view is stopped before it is sent, so discord.py does not keep it waiting for presses (a view it
    keeps ends after its timeout and is gone after a restart): presses are taken by their ``custom_id`` in
    :func:`take_press`, which holds across restarts."""
    view = discord.ui.View(timeout=None)
    for button in buttons:
        style = _STYLES.get(button.data.rpartition(":")[2], discord.ButtonStyle.secondary)
        view.add_item(discord.ui.Button(label=button.label[:80], custom_id=button.data, style=style))
    view.stop()
    return view


async def take_press(inbox: Inbox, interaction: discord.Interaction[Any], log: logging.Logger) -> None:
    """A press of one of our buttons: hand it to ``inbox`` and tell the one who pressed (privately) what
    came of it. Other interactions (slash commands, other bots' components) are left alone."""
    if interaction.type is not discord.InteractionType.component or interaction.channel_id is None:
        return
    data: dict[str, Any] = dict(interaction.data or {})
    custom_id = str(data.get("custom_id") or "")
    if not custom_id:
        return
    user = interaction.user
    press = Press(
        conversation=str(interaction.channel_id), sender_id=str(user.id), sender=user.name, data=custom_id
    )
    # Acknowledged first: answering waits on the database, and Discord drops an interaction not
    # acknowledged within 3 s ("This interaction failed"). A press acknowledged too late still counts: the
    # question is edited to its answer either way.
    try:
        await interaction.response.defer(ephemeral=True, thinking=True)
    except discord.HTTPException as exc:
        log.warning("could not acknowledge a press by %s in time (%s); answering it anyway", user.id, exc)
    try:
        told = (await inbox.press(press)).text
    except Exception:
        log.exception("could not answer a press of %s by %s", custom_id, user.id)
        told = "That answer could not be taken just now. Please press again in a moment."
    try:
        await interaction.followup.send(told, ephemeral=True)
    except discord.HTTPException as exc:
        log.info("could not tell %s what their press did (%s): %s", user.id, exc, told)
