"""The Telegram channel: python-telegram-bot, long polling, Markdown with a plain-text fallback.

Receiving drives ``getUpdates`` itself instead of PTB's Updater, because the offset is what acknowledges
an update to Telegram: the offset is kept in the ``kv`` table and moved past an update only after that
update is handled and committed (queued, or answered). A process killed between fetching an update and
queueing it fetches the same update again after the restart; a redelivered update is a duplicate
``external_id`` (``chat:message``) and is not queued twice.

Private chats take every message; groups only messages that mention the bot, reply to it, or are commands.
An agent's question comes with an inline keyboard, and a press of one of its buttons (a ``callback_query``
update) answers it (:mod:`adapters.telegram_questions`); its update is acknowledged, like a message's, only
once the answer is committed.
Replies are paced within Telegram's limits, a chat told to wait waiting alone
(:mod:`adapters.telegram_rate_limits`); progress notes are edited in place
(``editMessageText``). The Bot API base URL comes from
``TELEGRAM_API_BASE_URL`` (or ``[channels.telegram] api_base_url``), the token from ``TELEGRAM_BOT_TOKEN``
(or the variable named by ``token_env``).
"""

from __future__ import annotations

import asyncio
import contextlib
import mimetypes
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from telegram import Bot, BotCommand, Message, Update
from telegram.constants import ChatAction
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    NetworkError,
    TelegramError,
    TimedOut,
)
from telegram.ext import Application

from adapters.chunking import utf16_len
from adapters.platform import (
    Also,
    Button,
    ChannelSettings,
    HandleOutcome,
    Inbound,
    Platform,
    SendFailure,
    pause_for_tests_after_fetch,
    safe_filename,
    upload_folder,
)
from adapters.telegram_questions import conversation_of, inline_keyboard, take_press
from adapters.telegram_rate_limits import ChatRateLimiter
from shared.settings.channels import TelegramSettings

DEFAULT_API = "https://api.telegram.org"


def split_conversation(conversation: str) -> tuple[int | str, int | None]:
    """``"chat"`` or ``"chat:thread"`` → (chat id, forum topic id)."""
    chat, _, thread = conversation.partition(":")
    chat_id: int | str = int(chat) if re.fullmatch(r"-?\d+", chat) else chat
    return chat_id, int(thread) if thread.isdigit() else None


class TelegramChannel(Platform):
    """The Telegram adapter (``agentpost run telegram``)."""

    name: ClassVar[str] = "telegram"
    prefix: ClassVar[str] = "telegram"
    limit: ClassVar[int] = 4096
    settings_model: ClassVar[type[ChannelSettings]] = TelegramSettings
    can_edit: ClassVar[bool] = True
    platform_label: ClassVar[str] = "Telegram"
    long_reply_suffix: ClassVar[str] = ".md"
    state_scope: ClassVar[str] = "telegram"  # where earlier releases kept the update offset

    config: TelegramSettings
    app: Application[Any, Any, Any, Any, Any, Any] | None = None

    def read_secrets(self) -> None:
        self.token = self.require_env(self.config.token_env, "a bot token (from @BotFather)")
        base = self.env.get("TELEGRAM_API_BASE_URL") or self.config.api_base_url or DEFAULT_API
        self.api_base = base.rstrip("/")
        self.offset_key = f"offset:{self.token.split(':', 1)[0]}"

    def measure(self, text: str) -> int:
        return utf16_len(text)

    @property
    def bot(self) -> Bot:
        assert self.app is not None, "the adapter is not open"
        bot: Bot = self.app.bot
        return bot

    async def open(self) -> None:
        # PTB 22 warns (an error under our test settings) unless durations are timedeltas.
        os.environ.setdefault("PTB_TIMEDELTA", "1")
        self.app = (
            Application.builder()
            .token(self.token)
            .base_url(f"{self.api_base}/bot")
            .base_file_url(f"{self.api_base}/file/bot")
            .rate_limiter(ChatRateLimiter(retries=self.config.rate_limit_retries))
            .updater(None)
            .build()
        )
        await self.app.initialize()
        self.username = (self.bot.username or "").lower()
        with contextlib.suppress(TelegramError):
            await self.bot.set_my_commands(
                [
                    BotCommand("agent", "Send this chat's messages to an agent"),
                    BotCommand("team", "Send this chat's messages to a team"),
                    BotCommand("reset", "Start a fresh conversation"),
                    BotCommand("status", "What the agent is doing for this chat"),
                    BotCommand("stop", "Stop the agent's current run"),
                    BotCommand("queue", "collect, followup or interrupt: messages sent while busy"),
                    BotCommand("help", "What I understand"),
                ]
            )
        # A webhook left over from another deployment would make getUpdates fail with a conflict.
        await self.bot.delete_webhook(drop_pending_updates=False)

    async def close(self) -> None:
        if self.app is not None:
            with contextlib.suppress(Exception):
                await self.app.shutdown()
            self.app = None

    # -- receiving -----------------------------------------------------------------------------------------
    async def _fetch(self, offset: int) -> list[Update] | None:
        """One long poll, abandoned (None) when the adapter is asked to stop."""
        poll = asyncio.create_task(
            self.bot.get_updates(
                offset=offset or None,
                timeout=self.config.poll_timeout_seconds,
                allowed_updates=["message", "callback_query"],
            )
        )
        stop = asyncio.create_task(self.inbox.stop_event.wait())
        done, _ = await asyncio.wait({poll, stop}, return_when=asyncio.FIRST_COMPLETED)
        if poll not in done:
            poll.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await poll
            return None
        stop.cancel()
        return list(poll.result())

    async def receive(self) -> None:
        offset = int(await self.inbox.saved(self.offset_key) or 0)
        while not self.inbox.stop_event.is_set():
            try:
                updates = await self._fetch(offset)
            except Conflict as exc:
                self.log.warning("another poller uses this bot token (%s); retrying", exc)
                await asyncio.sleep(2.0)
                continue
            except (TimedOut, NetworkError) as exc:
                self.log.warning("getUpdates failed: %s; retrying", exc)
                await asyncio.sleep(1.0)
                continue
            if updates is None:
                return
            if updates:
                await pause_for_tests_after_fetch(self, f"{len(updates)} Telegram update(s)")
            for update in updates:
                after = update.update_id + 1

                # The offset commits with the message the update queued, or with the answer to its
                # command: one write, and never a confirmed update without what it caused.
                keep_offset = self.inbox.saving(self.offset_key, str(after))
                try:
                    if update.callback_query is not None:
                        # A press of a question's button: the answer is committed when take_press returns.
                        await take_press(self.bot, self.inbox, update.callback_query, self.log)
                        outcome: HandleOutcome = "ignored"
                    else:
                        outcome = await self.handle_update(update, also=keep_offset)
                    if outcome not in ("queued", "command"):  # nothing committed the offset: its own write
                        await self.inbox.save(self.offset_key, str(after))
                except Exception:
                    # Not committed: keep the offset here so the update is fetched and handled again.
                    self.log.exception(
                        "handling update %s failed; it will be fetched again", update.update_id
                    )
                    await asyncio.sleep(1.0)
                    break
                offset = after

    def _addressed(self, message: Message, text: str) -> tuple[bool, str]:
        """Whether a group message is meant for the bot, and its text without the bot's @mention."""
        if message.chat.type == "private":
            return True, text
        mention = f"@{self.username}" if self.username else ""
        mentioned = bool(mention) and mention in text.lower()
        reply = message.reply_to_message
        replied = reply is not None and reply.from_user is not None and reply.from_user.id == self.bot.id
        target = re.match(r"^/[A-Za-z0-9_]+@([A-Za-z0-9_]+)", text)
        command = text.startswith("/") and (target is None or target.group(1).lower() == self.username)
        if not (mentioned or replied or command):
            return False, text
        if mentioned and not command:
            text = re.sub(re.escape(mention), "", text, flags=re.IGNORECASE).strip()
        return True, text

    async def handle_update(self, update: Update, *, also: Also | None = None) -> HandleOutcome:
        """Turn one update into an :class:`Inbound` and hand it to the base (returns once committed);
        ``also`` commits with the message if one is queued or answered (see :meth:`adapters.intake.Intake.handle`)."""
        message = update.message
        if message is None or message.from_user is None or message.from_user.is_bot:
            return "ignored"
        text = message.text or message.caption or ""
        addressed, text = self._addressed(message, text)
        if not addressed:
            return "ignored"
        chat_id = message.chat.id
        conversation = conversation_of(message)
        external_id = f"{chat_id}:{message.message_id}"
        user = message.from_user
        files: list[Path] = []
        if await self.inbox.may_download(str(user.id)):
            files = await self._save_attachments(message, conversation)
        elif not text:
            text = "(an attachment)"  # a stranger still gets a pairing code, but nothing is downloaded
        return await self.inbox.handle(
            Inbound(
                conversation=conversation,
                sender_id=str(user.id),
                sender=user.username or user.full_name,
                text=text,
                external_id=external_id,
                files=files,
                metadata={"chat_type": message.chat.type, "telegram_message_id": message.message_id},
                # Updates wait at Telegram (24 h) while we are down: a late one's reply says so.
                sent_at=int(message.date.timestamp() * 1000),
            ),
            also=also,
        )

    async def _save_attachments(self, message: Message, conversation: str) -> list[Path]:
        target: tuple[str, str] | None = None
        if message.document is not None:
            target = (message.document.file_id, message.document.file_name or "document")
        elif message.photo:
            target = (message.photo[-1].file_id, "photo.jpg")
        elif message.voice is not None:  # OGG/Opus; heard by the speech-to-text service (adapters/voice.py)
            target = (message.voice.file_id, "voice.ogg")
        elif message.audio is not None:
            audio = message.audio
            suffix = mimetypes.guess_extension(audio.mime_type or "") or ".mp3"
            target = (audio.file_id, audio.file_name or f"audio{suffix}")
        if target is None:
            return []
        folder = upload_folder(self, conversation)
        path = folder / f"{message.message_id}-{safe_filename(target[1])}"
        if not path.exists():
            remote = await self.bot.get_file(target[0])
            tmp = path.with_name(path.name + ".part")
            await remote.download_to_drive(tmp)
            os.replace(tmp, path)
        return [path]

    # -- sending -------------------------------------------------------------------------------------------
    async def send_text(self, conversation: str, text: str) -> str | None:
        chat_id, thread = split_conversation(conversation)
        mode = self.config.parse_mode or None
        try:
            sent = await self.bot.send_message(chat_id, text, parse_mode=mode, message_thread_id=thread)
        except BadRequest as exc:
            if mode is None or "can't parse entities" not in str(exc).lower():
                raise
            # The agent's Markdown is not what Telegram accepts: the words matter more than the styling.
            sent = await self.bot.send_message(chat_id, text, message_thread_id=thread)
        return str(sent.message_id)

    async def send_file(self, conversation: str, path: Path, caption: str) -> str | None:
        chat_id, thread = split_conversation(conversation)
        sent = await self.bot.send_document(
            chat_id,
            document=path.read_bytes(),
            filename=path.name,
            caption=caption[:1024] or None,
            message_thread_id=thread,
        )
        return str(sent.message_id)

    def classify_send_error(self, exc: Exception) -> SendFailure:
        reason = f"Telegram: {exc}"
        if isinstance(exc, Forbidden):
            return SendFailure(True, reason, "the bot was blocked or removed from this chat")
        if isinstance(exc, ChatMigrated):
            return SendFailure(True, reason, "this group was moved to a new chat")
        # BadRequest is a NetworkError in PTB: test it first. A request Telegram refuses as malformed
        # (an unknown chat, a message too long) is refused the same way every time.
        if isinstance(exc, BadRequest):
            if "chat not found" in str(exc).lower():
                return SendFailure(True, reason, "the chat could not be found")
            return SendFailure(True, reason, "Telegram refused the message")
        return SendFailure(False, reason)

    async def send_question(self, conversation: str, text: str, buttons: Sequence[Button]) -> str | None:
        # Plain text, as a note: the question quotes a command, which need not be valid Markdown.
        chat_id, thread = split_conversation(conversation)
        sent = await self.bot.send_message(
            chat_id, text, message_thread_id=thread, reply_markup=inline_keyboard(buttons)
        )
        return str(sent.message_id)

    async def close_question(self, conversation: str, message_id: str, text: str) -> bool:
        # An edit without reply_markup takes the keyboard away: the question can no longer be pressed.
        return await self.edit_text(conversation, message_id, text)

    async def send_typing(self, conversation: str) -> None:
        chat_id, thread = split_conversation(conversation)
        await self.bot.send_chat_action(chat_id, ChatAction.TYPING, message_thread_id=thread)

    async def send_note(self, conversation: str, text: str) -> str:
        # Plain text: a note quotes the agent's last step, which need not be valid Markdown.
        chat_id, thread = split_conversation(conversation)
        sent = await self.bot.send_message(chat_id, text, message_thread_id=thread)
        return str(sent.message_id)

    async def edit_reply(self, conversation: str, message_id: str, text: str) -> bool:
        mode = self.config.parse_mode or None
        try:
            return await self.edit_text(conversation, message_id, text, parse_mode=mode)
        except BadRequest as exc:
            if mode is None or "can't parse entities" not in str(exc).lower():
                raise
            # As send_text: the words matter more than the styling (a half-written reply often has an
            # unclosed code block).
            return await self.edit_text(conversation, message_id, text)

    def preview_edit_seconds(self, conversation: str) -> float:
        # Telegram allows about one message a second per chat, and 20 a minute in a group (negative ids).
        return 3.0 if conversation.startswith("-") else 1.0

    async def edit_text(
        self, conversation: str, message_id: str, text: str, *, parse_mode: str | None = None
    ) -> bool:
        chat_id, _ = split_conversation(conversation)
        try:
            await self.bot.edit_message_text(
                text, chat_id=chat_id, message_id=int(message_id), parse_mode=parse_mode
            )
        except BadRequest as exc:
            reason = str(exc).lower()
            if "not modified" in reason:
                return True  # the same text again: nothing to change
            if "not found" in reason or "can't be edited" in reason:
                return False
            raise
        return True
