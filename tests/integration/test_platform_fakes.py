"""Prove the chat-platform fakes against the real client libraries.

Each test drives python-telegram-bot, discord.py or httpx against one fake over 127.0.0.1 and checks what
the fake recorded, so adapter tests built on these fakes exercise the libraries' real wire behaviour.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import io
import json
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import httpx
import pytest
import yarl
from telegram import (
    Bot,
    BotCommand,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    MessageEntity,
    Update,
)
from telegram.error import BadRequest, RetryAfter
from telegram.ext import AIORateLimiter, Application, ContextTypes, MessageHandler, filters

from tests.fakes.discord_api import FakeDiscord
from tests.fakes.telegram_api import FakeTelegram, TelegramCall
from tests.fakes.whatsapp_api import (
    FakeWhatsApp,
    button_reply_payload,
    signed_webhook,
    status_payload,
    text_message_payload,
)

with warnings.catch_warnings():
    # discord.py 2.6 imports the stdlib audioop module, deprecated since Python 3.11.
    warnings.filterwarnings("ignore", message="'audioop' is deprecated", category=DeprecationWarning)
    import discord
    from discord.gateway import DiscordWebSocket

pytestmark = [pytest.mark.integration, pytest.mark.timeout(15)]

# discord.py 2.6 passes a float `timeout` to aiohttp's ws_connect, which aiohttp >= 3.12 deprecates.
DISCORD_WARNINGS = pytest.mark.filterwarnings(
    "ignore:parameter 'timeout' of type 'float' is deprecated:DeprecationWarning"
)


# ---------------------------------------------------------------------------------------------- Telegram


@pytest.fixture
def telegram(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTelegram]:
    """A running fake Bot API; PTB_TIMEDELTA opts PTB 22 into timedelta durations (no deprecation warning)."""
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    with FakeTelegram() as fake:
        yield fake


def _bot(fake: FakeTelegram) -> Bot:
    return Bot(fake.token, base_url=fake.base_url, base_file_url=fake.base_file_url)


def test_telegram_polling_roundtrip(telegram: FakeTelegram) -> None:
    """PTB polls the fake, receives pushed updates, replies (text, reply, edit, action, document)."""
    seen_mentions: list[list[str]] = []

    async def on_text(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        message = update.effective_message
        assert message is not None and message.text is not None
        seen_mentions.append(list(message.parse_entities([MessageEntity.MENTION]).values()))
        await context.bot.send_chat_action(message.chat_id, "typing")
        draft = await message.reply_text("working…", do_quote=True)
        await draft.edit_text(f"echo: {message.text}")
        await context.bot.send_document(
            message.chat_id, document=b"%PDF-1.4 fake report", filename="report.pdf", caption="report"
        )

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], TelegramCall]:
        app = (
            Application.builder()
            .token(telegram.token)
            .base_url(telegram.base_url)
            .base_file_url(telegram.base_file_url)
            .rate_limiter(AIORateLimiter(max_retries=2))
            .build()
        )
        app.add_handler(MessageHandler(filters.TEXT, on_text))
        async with app:
            await app.bot.set_my_commands([BotCommand("new", "Start a new session")])
            await app.start()
            assert app.updater is not None
            await app.updater.start_polling(timeout=10)
            try:
                # The poll is parked on the server: the push must wake it, not the 10 s poll timeout.
                await asyncio.to_thread(telegram.wait_for_poller, 5)
                pushed_at = time.monotonic()
                update = telegram.push_text(4242, "hello there")
                document = await telegram.wait_for_async(lambda c: c.method == "sendDocument")
                assert time.monotonic() - pushed_at < 5

                group = telegram.push_text(
                    -1001234, "🙂 @agentpost_bot status?", user_id=7, username="bob", chat_type="supergroup"
                )
                await telegram.wait_for_async(
                    lambda c: c.method == "editMessageText" and c.chat_id == -1001234
                )
                await asyncio.to_thread(telegram.wait_for_offset, group["update_id"] + 1, 5)
            finally:
                await app.updater.stop()
                await app.stop()
        return update, group, document

    update, group, document = asyncio.run(scenario())
    assert update["update_id"] < group["update_id"]
    assert telegram.confirmed_offset == group["update_id"] + 1
    assert telegram.pending_updates == []
    assert seen_mentions == [[], ["@agentpost_bot"]]

    private = [c for c in telegram.sent if c.chat_id == 4242]
    assert [c.method for c in private] == ["sendChatAction", "sendMessage", "editMessageText", "sendDocument"]
    action, reply, edit, _ = private
    assert action.params["action"] == "typing"
    assert reply.text == "working…" and reply.parse_mode is None
    assert reply.reply_to_message_id == update["message"]["message_id"]
    assert reply.result["reply_to_message"]["text"] == "hello there"
    assert edit.text == "echo: hello there"
    assert edit.params["message_id"] == str(reply.result["message_id"])
    stored = telegram.message(4242, reply.result["message_id"])
    assert stored is not None and stored["text"] == "echo: hello there" and "edit_date" in stored
    assert document.document is not None
    assert (document.document.filename, document.document.data) == ("report.pdf", b"%PDF-1.4 fake report")
    assert document.caption == "report"
    assert document.result["document"]["file_name"] == "report.pdf"
    assert telegram.commands == [{"command": "new", "description": "Start a new session"}]
    methods = [c.method for c in telegram.calls]
    assert methods[:2] == ["getMe", "setMyCommands"]
    assert "deleteWebhook" in methods and "getUpdates" in methods


def test_telegram_markdown_rejection_allows_plain_fallback(telegram: FakeTelegram) -> None:
    """With reject_markdown, Markdown fails like the real API (BadRequest); plain text still goes out."""
    telegram.add_chat(4242)
    telegram.reject_markdown = True

    async def scenario() -> None:
        async with _bot(telegram) as bot:
            with pytest.raises(BadRequest, match=r"(?i)can't parse entities"):
                await bot.send_message(4242, "*unclosed", parse_mode="MarkdownV2")
            with pytest.raises(BadRequest, match=r"(?i)can't parse entities"):
                await bot.send_message(4242, "_unclosed", parse_mode="Markdown")
            sent = await bot.send_message(4242, "*unclosed")
            assert sent.text == "*unclosed"
            with pytest.raises(BadRequest, match=r"(?i)chat not found"):
                await bot.send_message(999, "nobody here")

    asyncio.run(scenario())
    assert [(c.text, c.parse_mode) for c in telegram.sent] == [("*unclosed", None)]
    rejected = [c for c in telegram.calls if not c.ok]
    assert [c.error["error_code"] for c in rejected if c.error] == [400, 400, 400]
    assert rejected[0].error is not None
    assert rejected[0].error["description"].startswith("Bad Request: can't parse entities")


def test_telegram_retry_after(telegram: FakeTelegram) -> None:
    """A 429 with parameters.retry_after raises RetryAfter; AIORateLimiter waits and retries it."""
    telegram.add_chat(4242)

    async def scenario() -> None:
        telegram.rate_limit_next("sendMessage", retry_after=1)
        async with _bot(telegram) as bot:
            with pytest.raises(RetryAfter) as raised:
                await bot.send_message(4242, "too fast")
            assert raised.value.retry_after == timedelta(seconds=1)

        telegram.rate_limit_next("sendMessage", retry_after=1)
        app = (
            Application.builder()
            .token(telegram.token)
            .base_url(telegram.base_url)
            .base_file_url(telegram.base_file_url)
            .rate_limiter(AIORateLimiter(max_retries=1))
            .build()
        )
        async with app:
            started = time.monotonic()
            await app.bot.send_message(4242, "eventually")
            assert time.monotonic() - started >= 1.0

    asyncio.run(scenario())
    attempts = [c for c in telegram.calls if c.method == "sendMessage"]
    assert [(c.text, c.error["error_code"] if c.error else 200) for c in attempts] == [
        ("too fast", 429),
        ("eventually", 429),
        ("eventually", 200),
    ]
    assert [c.text for c in telegram.sent] == ["eventually"]


def test_telegram_documents_offsets_and_long_poll_timeout(telegram: FakeTelegram) -> None:
    """getUpdates honours offset and timeout; pushed documents download through getFile."""
    payload = bytes(range(256)) * 4

    async def scenario() -> int:
        async with _bot(telegram) as bot:
            started = time.monotonic()
            assert await bot.get_updates(timeout=1) == ()
            assert time.monotonic() - started >= 0.9

            pushed = telegram.push_document(4242, "data.bin", payload, caption="see attached")
            update_id = int(pushed["update_id"])
            updates = await bot.get_updates(timeout=0)
            assert [u.update_id for u in updates] == [update_id]
            message = updates[0].effective_message
            assert message is not None and message.document is not None
            assert (message.document.file_name, message.caption) == ("data.bin", "see attached")

            again = await bot.get_updates(offset=update_id, timeout=0)
            assert [u.update_id for u in again] == [update_id]  # offset == id does not confirm it
            assert telegram.pending_updates != []

            file = await bot.get_file(message.document.file_id)
            assert file.file_size == len(payload)
            assert bytes(await file.download_as_bytearray()) == payload

            assert await bot.get_updates(offset=update_id + 1, timeout=0) == ()
            return update_id

    update_id = asyncio.run(scenario())
    assert telegram.confirmed_offset == update_id + 1
    assert telegram.pending_updates == []


def _keys(*rows: tuple[str, ...]) -> InlineKeyboardMarkup:
    return InlineKeyboardMarkup([[InlineKeyboardButton(d.title(), callback_data=d) for d in r] for r in rows])


def test_telegram_inline_keyboard_presses_and_answers(telegram: FakeTelegram) -> None:
    """A keyboard goes out with the message (in a forum topic) and comes back in it; a press arrives as a
    callback query only for a bot that asks for them; it is answered at most once, within 200 characters; an
    edit without reply_markup removes the keyboard, and one changing nothing is "not modified"."""
    forum = -1001777

    async def scenario() -> None:
        async with _bot(telegram) as bot:
            asked = telegram.push_text(
                forum, "@agentpost_bot go", user_id=7, username="ann", chat_type="supergroup", thread_id=5
            )
            (update,) = await bot.get_updates(timeout=0, allowed_updates=["message"])
            assert update.message is not None and update.message.message_thread_id == 5
            assert update.message.is_topic_message and update.message.chat.is_forum
            offset = int(asked["update_id"]) + 1

            with pytest.raises(BadRequest, match=r"(?i)button_data_invalid"):
                await bot.send_message(forum, "?", reply_markup=_keys(("x" * 65,)))
            question = await bot.send_message(
                forum, "Allow it?", message_thread_id=5, reply_markup=_keys(("allow", "deny"), ("chat",))
            )
            assert question.message_thread_id == 5 and question.is_topic_message
            assert question.reply_markup == _keys(("allow", "deny"), ("chat",))

            # Still asking for messages only: Telegram does not keep the press for this bot.
            telegram.push_callback_query(forum, question.message_id, "deny", user_id=8, username="bob")
            assert await bot.get_updates(offset=offset, timeout=0, allowed_updates=["message"]) == ()
            assert telegram.pending_updates == []

            kinds = ["message", "callback_query"]  # from now on (a press made before is gone)
            assert await bot.get_updates(offset=offset, timeout=0, allowed_updates=kinds) == ()
            telegram.push_callback_query(forum, question.message_id, "deny", user_id=8, username="bob")
            (pressed,) = await bot.get_updates(offset=offset, timeout=0, allowed_updates=kinds)
            query = pressed.callback_query
            assert query is not None and query.data == "deny" and query.from_user.username == "bob"
            assert query.message is not None and query.message.message_id == question.message_id
            assert query.message.message_thread_id == 5 and query.message.chat.id == forum
            assert await query.answer("Only ann can answer this request.", show_alert=True)
            with pytest.raises(BadRequest, match=r"(?i)query is too old"):
                await query.answer("again")  # at most once
            offset = pressed.update_id + 1

            telegram.push_callback_query(forum, question.message_id, "allow", user_id=7, username="ann")
            (mine,) = await bot.get_updates(offset=offset, timeout=0, allowed_updates=kinds)
            assert mine.callback_query is not None
            with pytest.raises(BadRequest, match=r"(?i)message_too_long"):
                await mine.callback_query.answer("x" * 201)
            assert await mine.callback_query.answer("Allowed")

            with pytest.raises(BadRequest, match=r"(?i)not modified"):
                await bot.edit_message_text(
                    "Allow it?",
                    chat_id=forum,
                    message_id=question.message_id,
                    reply_markup=_keys(("allow", "deny"), ("chat",)),
                )
            edited = await bot.edit_message_text("Allow it?", chat_id=forum, message_id=question.message_id)
            assert isinstance(edited, type(question)) and edited.reply_markup is None
            with pytest.raises(BadRequest, match=r"(?i)not modified"):  # no keyboard, same text: no change
                await bot.edit_message_text("Allow it?", chat_id=forum, message_id=question.message_id)
            await bot.edit_message_text("Allowed by ann", chat_id=forum, message_id=question.message_id)

    asyncio.run(scenario())
    keyboard = [[("Allow", "allow"), ("Deny", "deny")], [("Chat", "chat")]]
    assert telegram.chat_log(forum) == [
        ("sendMessage", 2, "Allow it?", keyboard),
        ("editMessageText", 2, "Allow it?", None),
        ("editMessageText", 2, "Allowed by ann", None),
    ]
    shown = telegram.message(forum, 2)
    assert shown is not None and "reply_markup" not in shown and shown["text"] == "Allowed by ann"
    answers = [(a["user_id"], a["text"], a["show_alert"]) for a in telegram.callback_answers]
    assert answers == [(8, "Only ann can answer this request.", True), (7, "Allowed", False)]
    # A client that had not seen the edit yet may still press an old button; a button never shown, not.
    telegram.push_callback_query(forum, 2, "chat", user_id=7)
    with pytest.raises(ValueError, match="never had a button"):
        telegram.push_callback_query(forum, 2, "maybe", user_id=7)


# ---------------------------------------------------------------------------------------------- Discord


@pytest.fixture
def discord_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDiscord]:
    """A running fake Discord with discord.py's two internal URLs pointed at it (restored afterwards)."""
    with FakeDiscord() as fake:
        _point_discord_at(monkeypatch, fake)
        yield fake


def _point_discord_at(monkeypatch: pytest.MonkeyPatch, fake: FakeDiscord) -> None:
    # The only two knobs: the REST base (class attribute) and the gateway used for IDENTIFY.
    monkeypatch.setattr(discord.http.Route, "BASE", fake.api_base)
    monkeypatch.setattr(DiscordWebSocket, "DEFAULT_GATEWAY", yarl.URL(fake.gateway_url))


class _Recorder(discord.Client):
    """A discord.py client that queues every message it sees from others and notes its own echoes."""

    def __init__(self, intents: discord.Intents) -> None:
        super().__init__(intents=intents, guild_ready_timeout=0.1)
        self.inbox: asyncio.Queue[discord.Message] = asyncio.Queue()
        self.own_echoes: list[str] = []
        self.echoed = asyncio.Condition()
        self.ready = asyncio.Event()

    async def on_ready(self) -> None:
        self.ready.set()

    async def on_message(self, message: discord.Message) -> None:
        if message.author == self.user:
            async with self.echoed:
                self.own_echoes.append(message.content)
                self.echoed.notify_all()
            return
        await self.inbox.put(message)


@asynccontextmanager
async def _running(fake: FakeDiscord, intents: discord.Intents) -> AsyncIterator[_Recorder]:
    client = _Recorder(intents)
    task = asyncio.create_task(client.start(fake.token))
    ready = asyncio.create_task(client.ready.wait())  # on_ready: READY + guild_ready_timeout
    try:
        done, _ = await asyncio.wait({task, ready}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()  # re-raises why the client stopped
            raise AssertionError("the discord client stopped before on_ready")
        if ready not in done:
            raise TimeoutError("the discord client was not ready within 10 s")
        await asyncio.to_thread(fake.wait_ready, 1)
        yield client
    finally:
        ready.cancel()
        await client.close()
        if not task.done():
            await asyncio.wait_for(task, 5)


def _content_intents() -> discord.Intents:
    intents = discord.Intents.default()
    intents.message_content = True
    return intents


@DISCORD_WARNINGS
def test_discord_login_dm_and_replies(discord_fake: FakeDiscord) -> None:
    """discord.py logs in over REST + gateway, gets a pushed DM and answers it in the same channel."""
    fake = discord_fake

    async def scenario() -> None:
        async with _running(fake, _content_intents()) as client:
            assert client.user is not None and client.user.id == fake.bot_id
            pushed = fake.push_message(5001, "run the tests please", author_id=77, author_name="bob")
            message = await asyncio.wait_for(client.inbox.get(), 5)
            assert isinstance(message.channel, discord.DMChannel)
            assert message.guild is None
            assert (message.id, message.content, message.author.id) == (
                int(pushed["id"]),
                pushed["content"],
                77,
            )

            await message.channel.typing()
            draft = await message.channel.send("working…")
            await draft.edit(content="all green")
            await message.reply("done", file=discord.File(io.BytesIO(b"log line\n"), filename="run.log"))
            dm = await message.author.send("also in your DMs")
            assert dm.channel.id == 5001
            await fake.wait_for_async(lambda s: s.content == "also in your DMs")
            # Discord echoes the bot's own messages back over the gateway; the client must skip them.
            async with client.echoed:
                await asyncio.wait_for(client.echoed.wait_for(lambda: len(client.own_echoes) >= 3), 5)
            assert sorted(client.own_echoes) == sorted(["working…", "done", "also in your DMs"])
            assert client.inbox.empty()

    asyncio.run(scenario())
    kinds = [(s.kind, s.channel_id, s.content) for s in fake.sent]
    assert kinds == [
        ("typing", 5001, None),
        ("message", 5001, "working…"),
        ("edit", 5001, "all green"),
        ("message", 5001, "done"),
        ("message", 5001, "also in your DMs"),
    ]
    reply = fake.sent[3]
    assert [(f.filename, f.data) for f in reply.attachments] == [("run.log", b"log line\n")]
    assert reply.reference_id is not None and reply.message is not None
    assert reply.message["attachments"][0]["filename"] == "run.log"
    paths = [(r.method, r.path, r.status) for r in fake.requests]
    assert paths[:2] == [("GET", "/api/v10/users/@me", 200), ("GET", "/api/v10/oauth2/applications/@me", 200)]
    assert ("POST", "/api/v10/users/@me/channels", 200) in paths
    assert fake.identifies == 1 and fake.heartbeats >= 1


@DISCORD_WARNINGS
def test_discord_guild_mentions_and_content_intent(discord_fake: FakeDiscord) -> None:
    """Without MESSAGE_CONTENT, guild messages arrive blank unless they mention the bot; guilds resolve."""
    fake = discord_fake
    fake.add_guild(9001, "Agents", channel_ids=[9100])
    intents = discord.Intents.default()  # no message_content

    async def scenario() -> None:
        async with _running(fake, intents) as client:
            guild = client.get_guild(9001)
            assert guild is not None and guild.name == "Agents" and guild.me is not None
            fake.push_message(9100, "chatter", author_id=78, author_name="carol", guild_id=9001)
            blank = await asyncio.wait_for(client.inbox.get(), 5)
            assert blank.content == "" and blank.guild is not None and blank.guild.id == 9001

            fake.push_message(
                9100, f"<@{fake.bot_id}> deploy", author_id=78, author_name="carol", guild_id=9001
            )
            mention = await asyncio.wait_for(client.inbox.get(), 5)
            assert mention.content == f"<@{fake.bot_id}> deploy"
            assert client.user in mention.mentions
            assert isinstance(mention.channel, discord.TextChannel) and mention.channel.id == 9100

            # A guild the bot has not seen arrives with a GUILD_CREATE first, as on a join.
            fake.push_message(9200, f"<@{fake.bot_id}> hi", author_id=79, author_name="dave", guild_id=9002)
            joined = await asyncio.wait_for(client.inbox.get(), 5)
            assert joined.guild is not None and joined.guild.id == 9002
            await joined.channel.send(f"hello <@{joined.author.id}>")
            sent = await fake.wait_for_async(lambda s: s.kind == "message")
            assert sent.channel_id == 9200 and sent.message is not None
            assert sent.message["guild_id"] == "9002"

    asyncio.run(scenario())


@DISCORD_WARNINGS
def test_discord_resume_and_rate_limit(discord_fake: FakeDiscord) -> None:
    """RECONNECT leads to a RESUME that keeps events flowing; a 429 with Via is waited out and retried."""
    fake = discord_fake

    async def scenario() -> None:
        async with _running(fake, _content_intents()) as client:
            fake.request_reconnect()
            await asyncio.to_thread(fake.wait_resumed, 1, 10)
            fake.push_message(5002, "after resume", author_id=80, author_name="erin")
            message = await asyncio.wait_for(client.inbox.get(), 5)
            assert message.content == "after resume"

            fake.rate_limit_next(retry_after=0.3)
            started = time.monotonic()
            await message.channel.send("patient")
            assert time.monotonic() - started >= 0.29  # discord.py slept retry_after

    asyncio.run(scenario())
    assert fake.identifies == 1 and fake.resumes == 1
    statuses = [r.status for r in fake.requests if r.path == "/api/v10/channels/5002/messages"]
    assert statuses == [429, 200]
    assert [s.content for s in fake.sent] == ["patient"]


@DISCORD_WARNINGS
def test_discord_privileged_intent_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """An app without the MESSAGE_CONTENT intent enabled is refused with close code 4014, as on Discord."""
    with FakeDiscord(allow_privileged_intents=False) as fake:
        _point_discord_at(monkeypatch, fake)

        async def scenario() -> None:
            with pytest.raises(discord.PrivilegedIntentsRequired):
                async with _running(fake, _content_intents()):
                    pass

        asyncio.run(scenario())
        assert fake.identifies == 0 and fake.close_codes == [4014]


class _Presses(_Recorder):
    """A :class:`_Recorder` that answers presses of buttons as agentpost does: defer privately, then an
    ephemeral followup naming who pressed what."""

    def __init__(self, intents: discord.Intents) -> None:
        super().__init__(intents)
        self.presses: asyncio.Queue[discord.Interaction] = asyncio.Queue()

    async def on_interaction(self, interaction: discord.Interaction) -> None:
        assert interaction.type is discord.InteractionType.component and interaction.data is not None
        await interaction.response.defer(ephemeral=True, thinking=True)
        custom_id = interaction.data.get("custom_id")
        await interaction.followup.send(f"{interaction.user.name} pressed {custom_id}", ephemeral=True)
        await self.presses.put(interaction)


def _buttons() -> discord.ui.View:
    view = discord.ui.View(timeout=None)
    view.add_item(
        discord.ui.Button(label="Allow", custom_id="apr_1:allow", style=discord.ButtonStyle.success)
    )
    view.add_item(discord.ui.Button(label="Deny", custom_id="apr_1:deny", style=discord.ButtonStyle.danger))
    view.stop()  # not kept by discord.py: presses come through on_interaction
    return view


@DISCORD_WARNINGS
@pytest.mark.parametrize("guild", [None, 9300], ids=["dm", "guild"])
def test_discord_buttons_presses_and_their_answers(discord_fake: FakeDiscord, guild: int | None) -> None:
    """Buttons sent with a message are kept on it; a press arrives as an INTERACTION_CREATE from the user
    who pressed (``user`` in a DM, ``member`` in a guild); the deferred answer and its ephemeral followup
    are recorded; an edit with ``view=None`` removes the buttons, which then cannot be pressed."""
    fake = discord_fake
    channel_id = 5003 if guild is None else 9301

    async def scenario() -> tuple[str, int]:
        client = _Presses(_content_intents())
        task = asyncio.create_task(client.start(fake.token))
        try:
            await asyncio.wait_for(client.ready.wait(), 10)
            text = "question" if guild is None else f"<@{fake.bot_id}> question"
            fake.push_message(channel_id, text, author_id=81, author_name="fay", guild_id=guild)
            incoming = await asyncio.wait_for(client.inbox.get(), 5)
            asked = await incoming.channel.send("Allow it?", view=_buttons())
            assert [c.custom_id for c in asked.components[0].children] == ["apr_1:allow", "apr_1:deny"]

            fake.press_button(asked.id, "apr_1:deny", user_id=82, username="gus")
            pressed = await asyncio.wait_for(client.presses.get(), 5)
            assert (pressed.user.id, pressed.user.name, pressed.channel_id) == (82, "gus", channel_id)
            assert isinstance(pressed.user, discord.Member) == (guild is not None)
            assert pressed.message is not None and pressed.message.id == asked.id
            await fake.wait_for_async(lambda s: s.kind == "followup")
            late = pressed.token

            await asked.edit(content="Denied by gus", view=None)
            with pytest.raises(ValueError, match="no button"):
                fake.press_button(asked.id, "apr_1:allow", user_id=81, username="fay")
            return late, pressed.id
        finally:
            await client.close()
            await asyncio.wait_for(task, 5)

    token, interaction_id = asyncio.run(scenario())
    kinds = [(s.kind, s.content, s.buttons, s.ephemeral) for s in fake.sent if s.channel_id == channel_id]
    assert kinds == [
        ("message", "Allow it?", [("Allow", "apr_1:allow", 3), ("Deny", "apr_1:deny", 4)], False),
        ("interaction_response", None, [], True),
        ("followup", "gus pressed apr_1:deny", [], True),
        ("edit", "Denied by gus", [], False),
    ]
    assert fake.sent[-3].payload["type"] == 5  # deferred: "thinking…", privately
    answered = fake.interaction(interaction_id)
    assert answered is not None and answered.answered_with == 5 and answered.user_id == 82
    # An interaction is answered once only, and only with its own token.
    callback = f"{fake.api_base}/interactions/{interaction_id}/{token}/callback"
    again = httpx.post(callback, json={"type": 4, "data": {"content": "twice"}})
    assert (again.status_code, again.json()["code"]) == (400, 40060)
    forged = httpx.post(callback.replace(token, "forged"), json={"type": 6})
    assert (forged.status_code, forged.json()["code"]) == (404, 10062)
    # The ephemeral followup is nobody else's: it is not in the channel's history.
    history = httpx.get(
        f"{fake.api_base}/channels/{channel_id}/messages", headers={"Authorization": f"Bot {fake.token}"}
    ).json()
    assert [m["content"] for m in history if m["author"]["id"] == str(fake.bot_id)] == ["Denied by gus"]


def test_discord_presses_must_be_answered_in_time(discord_fake: FakeDiscord) -> None:
    """An interaction not answered within the time Discord gives (3 s; shortened here) is unknown."""
    fake = discord_fake
    fake.answer_within = 0.2
    fake.push_message(5004, "hi", author_id=83, author_name="hal")
    headers = {"Authorization": f"Bot {fake.token}"}
    rows = [{"type": 1, "components": [{"type": 2, "style": 1, "label": "Go", "custom_id": "go"}]}]
    sent = httpx.post(
        f"{fake.api_base}/channels/5004/messages", json={"content": "q", "components": rows}, headers=headers
    ).json()
    bad = httpx.post(
        f"{fake.api_base}/channels/5004/messages",
        json={"content": "q", "components": [{"type": 2, "style": 1, "label": "Go"}]},
        headers=headers,
    )
    assert (bad.status_code, bad.json()["code"]) == (400, 50035)  # buttons go inside an action row
    pressed = fake.press_button(int(sent["id"]), "go", user_id=83, username="hal")
    time.sleep(0.3)
    url = f"{fake.api_base}/interactions/{pressed.interaction_id}/{pressed.token}/callback"
    late = httpx.post(url, json={"type": 6})
    assert (late.status_code, late.json()["code"]) == (404, 10062)
    followup = httpx.post(f"{fake.api_base}/webhooks/{fake.bot_id}/{pressed.token}", json={"content": "x"})
    assert (followup.status_code, followup.json()["code"]) == (404, 10015)  # never answered


# ---------------------------------------------------------------------------------------------- WhatsApp


def test_whatsapp_signed_webhook_verifies() -> None:
    """The webhook helper signs the raw body; a receiver's compare_digest check accepts it, not tampering."""
    secret = "app-secret-123"
    wamid = "wamid.HBgLTEST"
    body, headers = signed_webhook(secret, text_message_payload("15551234567", "héllo ✓", wamid=wamid))

    def verify(raw: bytes, header: str) -> bool:
        expected = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, header)

    assert headers["Content-Type"] == "application/json"
    assert verify(body, headers["X-Hub-Signature-256"])
    assert not verify(body.replace(b"15551234567", b"15550000000"), headers["X-Hub-Signature-256"])
    _, other = signed_webhook("wrong-secret", text_message_payload("15551234567", "héllo ✓", wamid=wamid))
    assert other["X-Hub-Signature-256"] != headers["X-Hub-Signature-256"]
    assert b"\\u00e9" in body  # Meta escapes non-ASCII; re-serialising would change the signed bytes

    value = json.loads(body)["entry"][0]["changes"][0]["value"]
    [message] = value["messages"]
    assert (message["from"], message["id"], message["type"], message["text"]["body"]) == (
        "15551234567",
        wamid,
        "text",
        "héllo ✓",
    )

    receipt_body, receipt_headers = signed_webhook(secret, status_payload(wamid, "15551234567", "read"))
    assert verify(receipt_body, receipt_headers["X-Hub-Signature-256"])
    receipt_value = json.loads(receipt_body)["entry"][0]["changes"][0]["value"]
    assert "messages" not in receipt_value
    assert receipt_value["statuses"][0]["id"] == wamid and receipt_value["statuses"][0]["status"] == "read"


def test_whatsapp_graph_send_upload_and_errors() -> None:
    """httpx posts to the Graph fake are authenticated, recorded, and can hit throughput errors."""
    with FakeWhatsApp() as fake, httpx.Client(base_url=fake.graph_url, timeout=5) as http:
        auth = {"Authorization": f"Bearer {fake.access_token}"}
        url = f"/v21.0/{fake.phone_number_id}/messages"
        text = {"messaging_product": "whatsapp", "to": "15551234567", "type": "text", "text": {"body": "hi"}}

        ok = http.post(url, json=text, headers=auth)
        assert ok.status_code == 200
        wamid = ok.json()["messages"][0]["id"]
        assert wamid.startswith("wamid.")
        recorded = fake.wait_for(lambda s: s.wamid == wamid)
        assert (recorded.to, recorded.type, recorded.text) == ("15551234567", "text", "hi")

        denied = http.post(url, json=text, headers={"Authorization": "Bearer nope"})
        assert denied.status_code == 401 and denied.json()["error"]["code"] == 190

        too_long = dict(text, text={"body": "x" * 4097})
        assert http.post(url, json=too_long, headers=auth).json()["error"]["code"] == 100

        fake.throttle_next(130429)
        fake.throttle_next(131056)
        for code in (130429, 131056):
            throttled = http.post(url, json=text, headers=auth)
            assert throttled.status_code == 400 and throttled.json()["error"]["code"] == code

        upload = http.post(
            f"/v21.0/{fake.phone_number_id}/media",
            data={"messaging_product": "whatsapp", "type": "text/plain"},
            files={"file": ("notes.txt", b"line one\n", "text/plain")},
            headers=auth,
        )
        assert upload.status_code == 200
        media_id = upload.json()["id"]
        document = {
            "messaging_product": "whatsapp",
            "to": "15551234567",
            "type": "document",
            "document": {"id": media_id, "filename": "notes.txt"},
        }
        assert http.post(url, json=document, headers=auth).status_code == 200
        info = http.get(f"/v21.0/{media_id}", headers=auth).json()
        assert info["mime_type"] == "text/plain" and info["file_size"] == len(b"line one\n")
        assert http.get(info["url"], headers=auth).content == b"line one\n"

    assert [(s.type, s.text, s.document) for s in fake.sent] == [
        ("text", "hi", None),
        ("document", None, {"id": media_id, "filename": "notes.txt"}),
    ]
    media = fake.media(media_id)
    assert media is not None and (media.filename, media.data) == ("notes.txt", b"line one\n")


def test_whatsapp_interactive_buttons_and_button_replies() -> None:
    """Reply-button messages are accepted within the Cloud API's limits (and refused beyond them, or when
    the fake is told to refuse them); a press comes back as an ``interactive`` ``button_reply`` message."""
    with FakeWhatsApp() as fake, httpx.Client(base_url=fake.graph_url, timeout=5) as http:
        auth = {"Authorization": f"Bearer {fake.access_token}"}
        url = f"/v21.0/{fake.phone_number_id}/messages"

        def question(*titles: str, body: str = "Allow it?") -> dict[str, Any]:
            buttons = [{"type": "reply", "reply": {"id": f"b{i}", "title": t}} for i, t in enumerate(titles)]
            interactive = {"type": "button", "body": {"text": body}, "action": {"buttons": buttons}}
            return {
                "messaging_product": "whatsapp",
                "to": "15551234567",
                "type": "interactive",
                "interactive": interactive,
            }

        ok = http.post(url, json=question("Allow", "Deny", "Allow for this chat"), headers=auth)
        assert ok.status_code == 200
        wamid = ok.json()["messages"][0]["id"]
        for refused in (
            question("1", "2", "3", "4"),  # at most three buttons
            question("A title over twenty chars"),
            question("Same", "Same"),
            question("Allow", body="x" * 1025),
        ):
            answer = http.post(url, json=refused, headers=auth)
            assert (answer.status_code, answer.json()["error"]["code"]) == (400, 131009), refused
        fake.refuse_interactive()
        unsupported = http.post(url, json=question("Allow"), headers=auth)
        assert (unsupported.status_code, unsupported.json()["error"]["code"]) == (400, 131051)

    (sent,) = fake.sent
    assert (sent.wamid, sent.type, sent.text) == (wamid, "interactive", "Allow it?")
    assert sent.buttons == [("b0", "Allow"), ("b1", "Deny"), ("b2", "Allow for this chat")]
    payload = button_reply_payload("15551234567", "b1", "Deny", context_wamid=wamid, name="Ann")
    message = payload["entry"][0]["changes"][0]["value"]["messages"][0]
    assert message["type"] == "interactive" and message["context"]["id"] == wamid
    assert message["interactive"] == {"type": "button_reply", "button_reply": {"id": "b1", "title": "Deny"}}
