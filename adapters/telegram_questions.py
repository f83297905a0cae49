"""An agent's questions on Telegram: the inline keyboard under a question, and a press of one of its buttons.

A question goes out with Allow / Deny on one row and Allow for this chat on the next (each button's
``callback_data`` is the :class:`adapters.platform.Button`'s data). A press arrives as a ``callback_query``
update: it is handed to the runner (:meth:`adapters.platform.Inbox.press`, which returns once the answer is
committed) as a :class:`adapters.platform.Press` from the chat the question was asked in, and the presser is
told what it did with ``answerCallbackQuery``. A press that changed nothing (someone else's request, one
already answered or over) is told as an alert the presser has to close, so it is not missed; a decision is a
short notification, the question itself being edited to it. Telegram forgets a callback query within
seconds: an answer it no longer takes is logged and dropped, the press stands.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from telegram import (
    Bot,
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    MaybeInaccessibleMessage,
    Message,
)
from telegram.error import TelegramError

from adapters.chunking import utf16_len
from adapters.platform import Button, Inbox, Press

#: Telegram's limit on the text of an answer to a callback query.
ANSWER_LIMIT = 200


def conversation_of(message: MaybeInaccessibleMessage) -> str:
    """The conversation id of the chat ``message`` is in: ``"chat"``, or ``"chat:topic"`` in a forum topic
    (the form messages of that chat are queued under)."""
    conversation = str(message.chat.id)
    if isinstance(message, Message) and message.is_topic_message and message.message_thread_id:
        conversation += f":{message.message_thread_id}"
    return conversation


def inline_keyboard(buttons: Sequence[Button]) -> InlineKeyboardMarkup:
    """The buttons under a question: the first two on one row, the rest (a longer label) on the next."""
    keys = [InlineKeyboardButton(b.label, callback_data=b.data) for b in buttons]
    rows = [keys[:2], keys[2:]] if len(keys) > 2 else [keys]
    return InlineKeyboardMarkup(rows)


def answer_text(text: str) -> str:
    """``text`` within Telegram's 200 characters for an answer to a press (cut with an ellipsis)."""
    if utf16_len(text) <= ANSWER_LIMIT:
        return text
    cut = text
    while utf16_len(cut) > ANSWER_LIMIT - 1:
        cut = cut[:-1]
    return cut + "…"


async def take_press(bot: Bot, inbox: Inbox, query: CallbackQuery, log: logging.Logger) -> None:
    """Apply a press of a question's button and tell the presser what it did (see the module docstring).
    Returns once the answer is committed: the update may be acknowledged then."""
    message = query.message
    if message is None or not query.data:
        # Not under a message of this bot's chats (an inline message) or no data: nothing to answer.
        await _answer(bot, query, None, alert=False, log=log)
        return
    user = query.from_user
    said = await inbox.press(
        Press(
            conversation=conversation_of(message),
            sender_id=str(user.id),
            sender=user.username or user.full_name,
            data=query.data,
        )
    )
    await _answer(bot, query, answer_text(said.text), alert=not said.decided, log=log)


async def _answer(
    bot: Bot, query: CallbackQuery, text: str | None, *, alert: bool, log: logging.Logger
) -> None:
    try:
        await bot.answer_callback_query(query.id, text=text, show_alert=alert or None)
    except TelegramError as exc:
        # Too late (Telegram keeps a query seconds) or the network: the press is applied either way.
        log.warning("could not tell %s what their press did: %s", query.from_user.id, exc)
