"""``POST /api/responses`` attaches only files a reply of its agent to its chat may send
(:mod:`shared.file_access`: the agent's workspace and that chat's uploads), against ``agentpost run web`` as a
real process. Every refused path is a 400 naming it, and nothing is queued."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.chat.address import ChatAddress
from shared.file_access import chat_upload_dir
from shared.runtime import Runtime
from tests.web_support import auth_headers, free_port, make_home, runtime_for, web_process

pytestmark = pytest.mark.integration

CHAT = "chat-1"


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[str, Runtime]]:
    home = make_home(tmp_path)
    port = free_port()
    with web_process(home, port):
        rt = runtime_for(home)
        try:
            yield f"http://127.0.0.1:{port}", rt
        finally:
            rt.close()


def post(url: str, files: list[str], *, agent: str = "alpha", conversation: str = CHAT) -> httpx.Response:
    body = {"channel": "web", "message": "here", "agent": agent, "conversation": conversation, "files": files}
    return httpx.post(f"{url}/api/responses", json=body, headers=auth_headers(url), timeout=10)


def responses(rt: Runtime) -> list[dict[str, object]]:
    return rt.db.read("SELECT * FROM responses ORDER BY id")


def test_paths_outside_the_roots_are_refused_and_nothing_is_queued(setup: tuple[str, Runtime]) -> None:
    url, rt = setup
    settings = rt.settings
    workspace = settings.workspace("alpha")
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "link-out").symlink_to("/etc/passwd")
    (workspace / "dir-out").symlink_to("/etc")
    other_chat = chat_upload_dir(settings, ChatAddress("web", conversation="chat-2"))
    other_chat.mkdir(parents=True, exist_ok=True)
    (other_chat / "private.txt").write_text("someone else's upload")
    secret = settings.home / "settings.toml"
    assert Path("/etc/passwd").exists()

    refused = {
        "/etc/shadow": "",
        "/etc/passwd": "outside",
        "../../x": "",
        "../" * 40 + "etc/passwd": "outside",
        "link-out": "outside",
        str(workspace / "link-out"): "outside",
        str(workspace / "dir-out" / "passwd"): "outside",
        str(workspace / ".." / ".." / "settings.toml"): "outside",
        str(secret): "outside",
        str(other_chat / "private.txt"): "outside",
        "/proc/self/environ": "outside",
        str(workspace): "not a regular file",
        "~/.bashrc": "",
    }
    before = responses(rt)
    for path, why in refused.items():
        r = post(url, [path])
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert repr(path) in error and why in error, (path, error)
        assert r.json()["file"] == path
        # One bad file among good ones refuses the whole response.
        (workspace / "good.txt").write_text("fine")
        assert post(url, ["good.txt", path]).status_code == 400
    # Another chat's upload is refused for this chat, with no agent too.
    assert post(url, [str(other_chat / "private.txt")], agent="").status_code == 400
    assert responses(rt) == before


def test_files_in_the_workspace_and_this_chats_uploads_are_queued(setup: tuple[str, Runtime]) -> None:
    url, rt = setup
    settings = rt.settings
    workspace = settings.workspace("alpha")
    (workspace / "out").mkdir(parents=True, exist_ok=True)
    (workspace / "out" / "report.txt").write_text("report")
    uploads = chat_upload_dir(settings, ChatAddress("web", conversation=CHAT))
    uploads.mkdir(parents=True, exist_ok=True)
    (uploads / "photo.jpg").write_bytes(b"\xff\xd8")

    r = post(url, ["out/report.txt", str(uploads / "photo.jpg")])
    assert r.status_code == 201, r.text
    files = r.json()["response"]["files"]
    # Stored resolved, so a later change of folder cannot make the path mean something else.
    assert files == [
        str((workspace / "out" / "report.txt").resolve()),
        str((uploads / "photo.jpg").resolve()),
    ]
    assert all(os.path.isabs(f) for f in files)
    rows = responses(rt)
    assert len(rows) == 1 and rows[0]["conversation"] == CHAT

    # With no agent only the chat's own uploads qualify.
    assert post(url, [str(uploads / "photo.jpg")], agent="").status_code == 201
    assert post(url, [str(workspace / "out" / "report.txt")], agent="").status_code == 400
