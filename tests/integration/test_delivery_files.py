"""Files a reply attaches, as a Telegram chat receives them: checked again when a reply is sent, not only when
it was queued (the real Telegram adapter sends a file from the agent's workspace and from the chat's own
uploads, and refuses everything else with a note), and a file the agent asked for but may not send is named
in the reply with the reason (the real claude CLI against the fake API, the real processor loop)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from adapters.telegram import TelegramChannel
from shared.chat.address import ChatAddress
from shared.file_access import chat_upload_dir
from tests.channel_support import HoldingTelegram, RunningChannel, channel_home, open_home, wait_for
from tests.fakes.anthropic_api import FakeAnthropic, Text
from tests.fixtures import anthropic_api, cli_installed, telegram_fake  # noqa: F401  (fixtures)
from tests.homes import build_home
from tests.liveness_support import claude_home, cli_env
from tests.processor_support import run_idle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_delivery_sends_only_allowed_files_and_says_so_for_the_rest(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    home = channel_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": {"allowlist": ["42"], "typing": False}}
    )
    rt = open_home(home)
    workspace = rt.settings.workspace("alpha")
    workspace.mkdir(parents=True)
    (workspace / "ok.txt").write_text("from the workspace")
    mine, theirs = (
        chat_upload_dir(rt.settings, ChatAddress("telegram", conversation="42")),
        chat_upload_dir(rt.settings, ChatAddress("telegram", conversation="43")),
    )
    for folder in (mine, theirs):
        folder.mkdir(parents=True)
        (folder / "pic.txt").write_text(f"upload of {folder.name}")
    # Queued as allowed, then swapped for a symlink out before it is sent.
    (workspace / "swapped.txt").write_text("harmless")
    queued = [str(workspace / "ok.txt"), str(mine / "pic.txt"), str(theirs / "pic.txt"), "/etc/passwd"]
    queued.append(str(workspace / "swapped.txt"))
    os.remove(workspace / "swapped.txt")
    os.symlink("/etc/passwd", workspace / "swapped.txt")
    fake.add_chat(42)
    try:
        with RunningChannel(
            TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}),
            deliver_only=True,
        ):
            rt.queue.responses.enqueue_response(
                ChatAddress("telegram", "ann", conversation="42"), "here you go", agent="alpha", files=queued
            )
            wait_for(lambda: len(fake.texts(42)) >= 4, 15, "the reply and the three notes")
            wait_for(lambda: len(fake.documents(42)) >= 2, 15, "the two allowed files")
            texts, documents = fake.texts(42), fake.documents(42)
    finally:
        rt.close()
    assert sorted(documents) == [("ok.txt", b"from the workspace"), ("pic.txt", b"upload of 42")]
    notes = [t for t in texts if "was not sent" in t]
    assert len(notes) == 3 and all("outside" in n for n in notes)


def test_a_refused_send_file_is_named_in_the_reply_the_chat_receives(
    tmp_path: Path, fake: HoldingTelegram, api: FakeAnthropic
) -> None:
    """The real claude CLI asks for four files; the processor attaches the one in its workspace and the
    Telegram chat reads, under the answer, which ones were not attached and why."""
    channels = {"telegram": {"allowlist": ["42"], "typing": False}}
    home = claude_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", channels=channels)
    secret = tmp_path / "secrets.txt"
    secret.write_text("do not send")
    asked = ["report.txt", str(secret), "link.txt", "/proc/self/environ"]
    api.add_rule("the report", Text("Here you go." + "".join(f"\n[send_file: {p}]" for p in asked)))
    fake.add_chat(42)
    rt = open_home(home)
    try:
        workspace = rt.settings.workspace("coder")
        workspace.mkdir(parents=True)
        (workspace / "report.txt").write_text("the numbers")
        (workspace / "link.txt").symlink_to(secret)
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="42"), "send me the report"
        )
        run_idle(rt, env=cli_env(api, tmp_path))
        with RunningChannel(
            TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}),
            deliver_only=True,
        ):
            wait_for(lambda: fake.texts(42) and fake.documents(42), 20, "the reply and its one file")
            texts, documents = fake.texts(42), fake.documents(42)
    finally:
        rt.close()
    assert texts == [
        "Here you go.\n\n"
        "(I couldn't attach secrets.txt: it is outside my workspace.)\n"
        "(I couldn't attach link.txt: it is a link to a place outside my workspace.)\n"
        "(I couldn't attach environ: it is outside my workspace.)"
    ]
    assert documents == [("report.txt", b"the numbers")]


def test_a_file_swapped_after_queueing_for_a_fifo_a_device_or_a_hard_link_is_not_sent(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    """Queued as plain files of the workspace, then swapped, as the agent may, before the channel sends them:
    a FIFO (a read would block the channel for good), a link to /dev/zero (a read never ends), a link out,
    and a hard link to a file outside. None is read; the chat is told about each."""
    home = channel_home(
        tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"telegram": {"allowlist": ["42"], "typing": False}}
    )
    secret = tmp_path / "secret.txt"
    secret.write_text("not the agent's")
    rt = open_home(home)
    workspace = rt.settings.workspace("alpha")
    workspace.mkdir(parents=True)
    names = ["fifo", "zero", "link", "hard"]
    for name in names:
        (workspace / name).write_text("harmless")
    queued = [str(workspace / name) for name in names]
    for name in names:
        os.remove(workspace / name)
    os.mkfifo(workspace / "fifo")
    os.symlink("/dev/zero", workspace / "zero")
    os.symlink(secret, workspace / "link")
    os.link(secret, workspace / "hard")
    fake.add_chat(42)
    try:
        with RunningChannel(
            TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}),
            deliver_only=True,
        ):
            rt.queue.responses.enqueue_response(
                ChatAddress("telegram", "ann", conversation="42"), "here", agent="alpha", files=queued
            )
            wait_for(lambda: len(fake.texts(42)) >= 5, 15, "the reply and the four notes")
            texts, documents = fake.texts(42), fake.documents(42)
    finally:
        rt.close()
    assert documents == []
    notes = sorted(t for t in texts if "was not sent" in t)
    assert len(notes) == 4, texts
    assert "hard, was not sent: a file with other names (a hard link)" in " ".join(notes)
    assert not list((home / "files" / "outbound").glob("telegram/send-*"))  # no copy left behind


def test_a_reply_over_the_limit_reaches_the_chat_cut_with_its_whole_text_as_a_file(
    tmp_path: Path, fake: HoldingTelegram
) -> None:
    """A command agent prints 300,000 characters (past ``reply_max_chars``, set to 2,000 here); the real
    processor cuts the reply and attaches ``reply.txt``, and the real Telegram adapter sends both: the chat
    reads the start with the note, and receives the whole text as a document."""
    printer = (
        "import sys; sys.stdin.read(); sys.stdout.write(''.join('line %06d\\n' % n for n in range(25000)))"
    )
    home = build_home(
        tmp_path,
        f"sqlite:///{tmp_path / 'a.db'}",
        {"alpha": {"provider": "command", "command": [sys.executable, "-c", printer]}},
        channels={"telegram": {"allowlist": ["42"], "typing": False, "preview": False}},
        processor={"reply_max_chars": 2000},
    )
    whole = "".join(f"line {n:06d}\n" for n in range(25000))
    fake.add_chat(42)
    rt = open_home(home)
    try:
        rt.queue.intake.enqueue_message(
            ChatAddress("telegram", "ann", sender_id="42", conversation="42"), "go"
        )
        run_idle(rt)
        with RunningChannel(
            TelegramChannel(rt, env={"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url}),
            deliver_only=True,
        ):
            wait_for(lambda: fake.documents(42), 15, "the whole reply as a document")
            texts, documents = fake.texts(42), fake.documents(42)
    finally:
        rt.close()
    assert documents == [("reply.txt", whole.rstrip().encode())]  # the reply, as a reply is: stripped
    shown = "\n".join(texts)
    assert shown.startswith(whole[:2000].rstrip()[:100])
    assert (
        "(The reply was 299,999 characters; the first 2,000 are shown and the whole text is attached as reply.txt.)"
        in shown
    )
