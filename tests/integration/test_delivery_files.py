"""Files are checked again when a reply is sent, not only when it was queued: the real Telegram adapter sends
a file from the agent's workspace and from the chat's own uploads, and refuses everything else with a note."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from adapters.telegram import TelegramChannel
from shared.file_access import chat_upload_dir
from tests.channel_support import HoldingTelegram, RunningChannel, channel_home, open_home, wait_for
from tests.fixtures import telegram_fake  # noqa: F401  (fixtures)

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
        chat_upload_dir(rt.settings, "telegram", "42"),
        chat_upload_dir(rt.settings, "telegram", "43"),
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
            rt.queue.enqueue_response(
                "telegram", "ann", "here you go", conversation="42", agent="alpha", files=queued
            )
            wait_for(lambda: len(fake.texts(42)) >= 4, 15, "the reply and the three notes")
            wait_for(lambda: len(fake.documents(42)) >= 2, 15, "the two allowed files")
            texts, documents = fake.texts(42), fake.documents(42)
    finally:
        rt.close()
    assert sorted(documents) == [("ok.txt", b"from the workspace"), ("pic.txt", b"upload of 42")]
    notes = [t for t in texts if "was not sent" in t]
    assert len(notes) == 3 and all("outside" in n for n in notes)
