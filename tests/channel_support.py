"""Helpers for the channel adapter tests: homes with channel settings, adapter and processor processes,
a scripted agent, and wrappers around the platform fakes that can hold a send in flight.

The fakes themselves (``tests/fakes``) are not changed; the wrappers subclass them and override only the
request entry point, so everything the client library sees is still the fake's real behaviour.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from adapters.platform import Platform
from adapters.runner import ChannelRunner
from adapters.whatsapp import WhatsAppChannel
from shared.runtime import Runtime
from tests.fakes.discord_api import FakeDiscord
from tests.fakes.slack_api import FakeSlack
from tests.fakes.telegram_api import FakeTelegram, TelegramApiError
from tests.fakes.whatsapp_api import FakeWhatsApp
from tests.homes import build_home, open_home, scripted_agents  # noqa: F401  (open_home re-exported)
from tests.probes import count, free_port, wait_for  # noqa: F401  (re-exported: tests import them from here)

REPO_ROOT = Path(__file__).resolve().parents[1]

#: The scripted agent CLI (run by the processor's ``command`` provider; the prompt arrives on stdin).
#: ``long=N`` replies with N numbered paragraphs of ~300 characters; ``file=NAME`` writes NAME in the
#: workspace and attaches it with ``[send_file: NAME]``; ``sleep=S`` waits first; otherwise it echoes.
AGENT_SCRIPT = r"""
import os, sys, time
prompt = sys.stdin.read()
agent = os.environ.get("AGENTPOST_AGENT", "?")
words = prompt.split()
for w in words:
    if w.startswith("sleep="):
        time.sleep(float(w.split("=", 1)[1]))
out = []
for w in words:
    if w.startswith("long="):
        n = int(w.split("=", 1)[1])
        for i in range(1, n + 1):
            out.append(f"Paragraph {i} of {n}. " + ("lorem ipsum dolor sit amet " * 11).strip() + f" [end {i}]")
    if w.startswith("file="):
        name = w.split("=", 1)[1]
        with open(name, "w") as f:
            f.write(f"file {name} made by {agent}\n")
        out.append(f"Here is {name}. [send_file: {name}]")
if not out:
    out.append(f"{agent} got: {prompt.strip()[-200:]}")
print("\n\n".join(out))
"""


def agent_script(tmp: Path) -> Path:
    path = tmp / "channel_agent.py"
    path.write_text(AGENT_SCRIPT, encoding="utf-8")
    return path


def channel_home(
    tmp: Path,
    db_url: str,
    channels: Mapping[str, Any],
    *,
    agents: tuple[str, ...] = ("alpha", "beta"),
    teams: Mapping[str, Any] | None = None,
    queue: Mapping[str, Any] | None = None,
) -> Path:
    """A home folder: ``db_url``, scripted agents, the given ``[channels]`` and fast test timings."""
    agent_settings = scripted_agents(agent_script(tmp), agents)
    return build_home(tmp, db_url, agent_settings, teams=teams, queue=queue, channels=channels)


class Proc:
    """A real ``agentpost run KIND`` process with its output in a log file."""

    def __init__(self, kind: str, home: Path, env: Mapping[str, str], log: Path) -> None:
        self.kind = kind
        self.log = log
        full_env = {
            **os.environ,
            "AGENTPOST_HOME": str(home),
            "PTB_TIMEDELTA": "1",
            "PYTHONUNBUFFERED": "1",
            "AGENTPOST_LOG_LEVEL": "INFO",
            **env,
        }
        full_env.pop("AGENTPOST_DATABASE_URL", None)
        self._out = log.open("ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "shared.cli.main", "run", kind],
            cwd=REPO_ROOT,
            env=full_env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_output(self, needle: str, timeout: float = 60.0) -> None:
        wait_for(lambda: needle in self.output() or self._died(), timeout, f"{needle!r} in {self.kind} log")
        assert needle in self.output(), f"{self.kind} exited early:\n{self.output()}"

    def _died(self) -> bool:
        return self.popen.poll() is not None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)
        self._out.close()

    def stop(self, timeout: float = 15.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                children = descendants(self.popen.pid)
                self.popen.send_signal(signal.SIGUSR1)  # its threads' stacks into the log: where it hangs
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.popen.wait(2)
                self.popen.kill()
                self.popen.wait(5)
                self._out.close()
                raise AssertionError(
                    f"{self.kind} did not stop on SIGTERM; its processes then:\n{children}\n{self.output()}"
                ) from None
        self._out.close()
        return int(self.popen.returncode)


def descendants(pid: int) -> str:
    """``ps`` lines of ``pid`` and every process under it (what a process that will not stop waits for)."""
    table = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,stat=,etime=,args="], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    parents = {int(line.split()[0]): int(line.split()[1]) for line in table}

    def under(p: int) -> bool:
        while p > 1:
            if p == pid:
                return True
            p = parents.get(p, 0)
        return False

    return "\n".join(line for line in table if under(int(line.split()[0])))


def stop_all(*procs: Proc) -> None:
    """Stop every one of ``procs`` (SIGTERM), even when one of them does not stop; then report the first
    that did not (a process left running would fail a later test with its warning)."""
    failures: list[AssertionError] = []
    for proc in procs:
        try:
            proc.stop()
        except AssertionError as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


def run_cli(home: Path, *args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``agentpost ARGS`` as a process (stdout and stderr captured)."""
    full_env = {**os.environ, "AGENTPOST_HOME": str(home), "PTB_TIMEDELTA": "1", **(env or {})}
    full_env.pop("AGENTPOST_DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "shared.cli.main", *args],
        cwd=REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
    )


class HoldingTelegram(FakeTelegram):
    """A fake Bot API that can hold the N-th ``sendMessage`` (from now on) until released.

    A held request is then dropped unanswered-in-effect: it fails with 502 and is not recorded, as if it
    never reached Telegram (the adapter was killed while it was in flight).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hold_at: int | None = None
        self._send_seen = 0
        self.held = threading.Event()
        self._release = threading.Event()

    def hold_send(self, nth: int) -> None:
        with self._cond:
            self._hold_at = nth
            self._send_seen = 0
            self.held.clear()
            self._release.clear()

    def release(self) -> None:
        self._release.set()

    def _call(
        self, token: str, method: str, fields: dict[str, str], files: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        hold = False
        if method.lower() == "sendmessage":
            with self._cond:
                self._send_seen += 1
                if self._hold_at is not None and self._send_seen == self._hold_at:
                    hold = True
                    self._hold_at = None
        if hold:
            self.held.set()
            self._release.wait(30)
            return 502, TelegramApiError(502, "Bad Gateway").to_json()
        return super()._call(token, method, fields, files)

    def texts(self, chat_id: int) -> list[str]:
        """Texts successfully sent to ``chat_id``, oldest first."""
        return [c.text or "" for c in self.sent if c.method == "sendMessage" and c.chat_id == chat_id]

    def shown(self, chat_id: int) -> list[str]:
        """The texts of the bot's messages in ``chat_id`` as the chat shows them now, oldest first: a final
        reply edited into its live preview is there, where :meth:`texts` has only what was first sent."""
        return [str(m.get("text") or "") for m in self.bot_messages(chat_id)]

    def documents(self, chat_id: int) -> list[tuple[str, bytes]]:
        """(filename, data) of documents sent to ``chat_id``."""
        return [
            (c.document.filename, c.document.data)
            for c in self.sent
            if c.method == "sendDocument" and c.chat_id == chat_id and c.document is not None
        ]


def telegram_env(fake: FakeTelegram, **extra: str) -> dict[str, str]:
    return {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url, **extra}


def discord_env(fake: FakeDiscord, **extra: str) -> dict[str, str]:
    return {
        "DISCORD_BOT_TOKEN": fake.token,
        "DISCORD_API_BASE_URL": fake.api_base,
        "DISCORD_GATEWAY_URL": fake.gateway_url,
        **extra,
    }


def whatsapp_env(
    fake: FakeWhatsApp, secret: str, port: int, verify: str = "v", **extra: str
) -> dict[str, str]:
    """The environment of a WhatsApp adapter against ``fake``: app secret ``secret``, webhook on ``port``."""
    return {
        "WHATSAPP_ACCESS_TOKEN": fake.access_token,
        "WHATSAPP_PHONE_NUMBER_ID": fake.phone_number_id,
        "WHATSAPP_APP_SECRET": secret,
        "WHATSAPP_VERIFY_TOKEN": verify,
        "WHATSAPP_GRAPH_URL": fake.graph_url,
        "WHATSAPP_WEBHOOK_PORT": str(port),
        **extra,
    }


def slack_env(fake: FakeSlack, *, secret: str = "", port: int = 0, **extra: str) -> dict[str, str]:
    """The environment of a Slack adapter against ``fake``: Socket Mode (its app token), or with ``secret``
    the Events API over HTTP on ``port``."""
    receive = {"SLACK_SIGNING_SECRET": secret, "SLACK_WEBHOOK_PORT": str(port)} if secret else {}
    return {
        "SLACK_BOT_TOKEN": fake.bot_token,
        "SLACK_API_URL": fake.api_url,
        **(receive or {"SLACK_APP_TOKEN": fake.app_token}),
        **extra,
    }


def webhook_up(url: str) -> bool:
    """Whether the WhatsApp webhook at ``url`` answers (a GET without the verify token is refused: 403)."""
    try:
        return httpx.get(url).status_code == 403
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def whatsapp_webhook(rt: Runtime, fake: FakeWhatsApp, secret: str, port: int | None = None) -> Iterator[str]:
    """A WhatsApp adapter running in-process against ``fake``; yields its webhook's URL once it answers."""
    port = port or free_port()
    with RunningChannel(WhatsAppChannel(rt, env=whatsapp_env(fake, secret, port))):
        url = f"http://127.0.0.1:{port}/webhook"
        wait_for(lambda: webhook_up(url), 10, "the webhook")
        yield url


def events(rt: Runtime, type_: str) -> list[dict[str, Any]]:
    rows = rt.db.read("SELECT payload FROM events WHERE type = :t ORDER BY id", {"t": type_})
    return [json.loads(r["payload"]) for r in rows]


class RunningChannel:
    """A channel adapter running in-process in its own thread and event loop (integration tests): a
    platform under the channel runner (a bare platform gets a runner of its own)."""

    def __init__(self, channel: Platform | ChannelRunner, *, deliver_only: bool = False) -> None:
        import asyncio

        runner = channel if isinstance(channel, ChannelRunner) else ChannelRunner(channel)
        self.channel = runner
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: list[BaseException] = []
        self._started = threading.Event()

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._started.set()
            if deliver_only:
                await runner.platform.open()
                try:
                    await runner.delivery.loop()
                finally:
                    await runner.platform.close()
            else:
                await runner.run()

        def target() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:
                self._error.append(exc)
                self._started.set()

        self._thread = threading.Thread(target=target, name=f"channel-{runner.name}", daemon=True)
        self._thread.start()
        self._started.wait(10)

    def stop(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self.channel.stop_event.set)
        self._thread.join(20)
        assert not self._thread.is_alive(), "the channel did not stop"
        if self._error:
            raise self._error[0]

    def __enter__(self) -> RunningChannel:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
