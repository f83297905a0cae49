"""Per-channel latency with a zero-time agent: platform update → agent start, and agent result → platform send.

Real processes on one SQLite home: ``agentpost run processor`` and the channel's own process, against the
platform fakes of the tests (in this process). The agent is the ``command`` provider running ``cat`` (the
reply is the prompt, printed at once). Messages go one at a time, each after the previous reply arrived, so
each meets a quiet chat and an idle agent.

Per message, on one clock (epoch ms; the fakes' monotonic times are converted once):

- ``in``: the platform update → the processor's ``chain_step_start`` event (adapter intake, queue, wake-up,
  claim, the run starting), split into ``intake`` (update → the ``message_received`` event: the channel
  process took it in and queued it) and ``queued → agent start``;
- ``out``: the processor's ``chain_step_done`` event → the platform received the reply (completion,
  wake-up, delivery);
- ``cli run``: ``chain_step_start`` → ``chain_step_done`` (spawning ``cat``, as the processor sees it).

The channels:

- ``telegram``: the update is pushed into the fake Bot API (the adapter long-polls ``getUpdates``); the reply
  is the fake's ``sendMessage``;
- ``web``: ``POST /api/message`` to ``agentpost run web``; the reply is the ``message:done`` event on the
  dashboard's event stream (``GET /api/events/stream``), read by an SSE client in this process;
- ``whatsapp``: a signed webhook POST to ``agentpost run whatsapp`` (timed from just before the POST); the
  reply is the fake Graph API's ``/messages`` call;
- ``cli``: ``agentpost send --wait`` as a new process; ``in`` counts from the process start (the Python
  start-up and imports included) and ``in (enqueued)`` from its ``message_received`` event; ``out`` ends when
  the reply's text is printed.

    .venv/bin/python bench/channel_latency.py --n 40 [--channels telegram,web,cli] [--debounce-ms 0]
        [--json out.json]

``--debounce-ms`` sets ``[queue] debounce_ms`` (default: the setting's default). The Telegram fake answers
with TCP_NODELAY here (see ``_PromptHandler``); ``--nagle`` uses it unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import tomlkit  # noqa: E402
from measure import spread  # noqa: E402

from shared.runtime import Runtime, open_runtime  # noqa: E402
from shared.settings.api_token import read_token_file, token_path  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram, _Handler  # noqa: E402
from tests.fakes.whatsapp_api import FakeWhatsApp, signed_webhook, text_message_payload  # noqa: E402
from tests.probes import free_port, wait_for  # noqa: E402

CHAT = 42
WA_USER = "15550001111"
WA_SECRET = "bench-app-secret"
AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def _now() -> float:
    return time.time() * 1000


def _home(root: Path, debounce_ms: int | None) -> Path:
    home = root / "home"
    home.mkdir(parents=True)
    cat = shutil.which("cat") or "/bin/cat"
    queue: dict[str, Any] = {"default_agent": "alpha"}
    if debounce_ms is not None:
        queue["debounce_ms"] = debounce_ms
    settings = {
        "database": {"url": f"sqlite:///{root / 'agentpost.db'}"},
        "agents": {"alpha": {"provider": "command", "command": [cat]}},
        "queue": queue,
        "channels": {
            "telegram": {"allowlist": [str(CHAT)], "poll_timeout_seconds": 10},
            "whatsapp": {"allowlist": [WA_USER], "read_receipts": False},
        },
    }
    (home / "settings.toml").write_text(tomlkit.dumps(settings), encoding="utf-8")
    return home


def _env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), AGENTPOST_LOG_LEVEL="WARNING", PTB_TIMEDELTA="1", NO_COLOR="1")
    env.update(extra or {})
    return env


def _start(kind: str, home: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [AGENTPOST, "run", kind], cwd=REPO, env=_env(home, env), stdout=out, stderr=out
        )


def _wait(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    return wait_for(condition, timeout, what, interval=0.001, error=TimeoutError)


def _events(rt: Runtime, message_id: str) -> dict[str, int] | None:
    rows = rt.db.read(
        "SELECT type, created_at FROM events WHERE message_id = :m ORDER BY id", {"m": message_id}
    )
    found: dict[str, int] = {}
    for r in rows:
        found.setdefault(r["type"], int(r["created_at"]))
    return found if "chain_step_done" in found else None


def _message_id(rt: Runtime, text: str) -> str | None:
    found = rt.db.read_scalar("SELECT message_id FROM messages WHERE message = :t", {"t": text})
    return None if found is None else str(found)


def _sample(rt: Runtime, text: str, started: float, replied: float) -> dict[str, float]:
    mid = _wait(lambda: _message_id(rt, text), 10, "the message row")
    ev = _wait(lambda: _events(rt, mid), 10, "the run's events")
    return {
        "in": ev["chain_step_start"] - started,
        "intake": ev["message_received"] - started,
        "in_enqueued": ev["chain_step_start"] - ev["message_received"],
        "out": replied - ev["chain_step_done"],
        "cli_run": ev["chain_step_done"] - ev["chain_step_start"],
        "total": replied - started,
    }


# -- channels --------------------------------------------------------------------------------------------
class _PromptHandler(_Handler):
    # The fake writes a reply's head and body in two writes; with Nagle's algorithm on, the body waits for
    # the client's delayed ACK of the head (~40 ms on Linux). Telegram's servers do not do that, so the
    # benchmark's fake sends at once (``--nagle`` measures the fake as the tests use it).
    disable_nagle_algorithm = True


class _PromptTelegram(FakeTelegram):
    handler_class = _PromptHandler


NAGLE = False


def run_telegram(root: Path, home: Path, rt: Runtime, n: int, warmup: int) -> list[dict[str, float]]:
    samples = []
    with FakeTelegram() if NAGLE else _PromptTelegram() as fake:
        proc = _start(
            "telegram",
            home,
            {"TELEGRAM_BOT_TOKEN": fake.token, "TELEGRAM_API_BASE_URL": fake.url},
            root / "telegram.log",
        )
        try:
            _wait(lambda: any(c.method == "getUpdates" for c in fake.calls), 30, "the adapter to poll")
            offset = _now() - time.monotonic() * 1000
            for i in range(warmup + n):
                text = f"ping telegram {i}"
                started = _now()
                fake.push_text(CHAT, text)
                reply = _wait(
                    lambda t=text: next(
                        (c for c in fake.sent if c.method == "sendMessage" and t in (c.text or "")), None
                    ),
                    30,
                    f"reply {i}",
                )
                if i >= warmup:
                    samples.append(_sample(rt, text, started, reply.at * 1000 + offset))
        finally:
            _stop(proc)
    return samples


class _Stream:
    """An SSE client in a thread: the arrival time (epoch ms) of each ``message:done`` per message id."""

    def __init__(self, port: int, token: str) -> None:
        self.done: dict[str, float] = {}
        self._sock = socket.create_connection(("127.0.0.1", port))
        request = (
            f"GET /api/events/stream HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
            f"Authorization: Bearer {token}\r\n\r\n"
        )
        self._sock.sendall(request.encode())
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError:
                return
            if not chunk:
                return
            at = _now()
            buffer += chunk
            # Chunk-size lines of the transfer encoding do not start with "data:", so scanning lines is enough.
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                try:
                    data = json.loads(line[5:].strip())
                except ValueError:
                    continue
                if data.get("event") == "response_ready" and data.get("messageId"):
                    self.done.setdefault(str(data["messageId"]), at)

    def close(self) -> None:
        self._sock.close()


def run_web(root: Path, home: Path, rt: Runtime, n: int, warmup: int) -> list[dict[str, float]]:
    port = free_port()
    proc = _start("web", home, {"AGENTPOST_API_PORT": str(port)}, root / "web.log")
    samples = []
    try:
        _wait(lambda: _healthy(port), 30, "the web process")
        # The API asks for a token: the one the web process made in the home, as the CLI reads it.
        token = read_token_file(token_path(home)) or ""
        stream = _Stream(port, token)
        time.sleep(0.3)  # the stream is open and live before the first message
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=auth, timeout=10) as client:
            for i in range(warmup + n):
                text = f"ping web {i}"
                started = _now()
                answer = client.post("/api/message", json={"message": text, "sender": "bench"})
                answer.raise_for_status()
                mid = str(answer.json()["messageId"])
                replied = _wait(lambda m=mid: stream.done.get(m), 30, f"reply {i}")
                if i >= warmup:
                    samples.append(_sample(rt, text, started, replied))
        stream.close()
    finally:
        _stop(proc)
    return samples


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def run_cli(root: Path, home: Path, rt: Runtime, n: int, warmup: int) -> list[dict[str, float]]:
    samples = []
    env = _env(home)
    for i in range(warmup + n):
        text = f"ping cli {i}"
        started = _now()
        proc = subprocess.Popen(
            [AGENTPOST, "send", "--wait", text], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        assert proc.stdout is not None
        replied = 0.0
        for raw in proc.stdout:
            if text.encode() in raw:
                replied = _now()
                break
        proc.stdout.read()
        proc.wait(30)
        if not replied:
            raise RuntimeError(f"send --wait did not print the reply to {text!r}")
        if i >= warmup:
            samples.append(_sample(rt, text, started, replied))
    return samples


def run_whatsapp(root: Path, home: Path, rt: Runtime, n: int, warmup: int) -> list[dict[str, float]]:
    samples = []
    with FakeWhatsApp() as fake:
        port = free_port()
        env = {
            "WHATSAPP_ACCESS_TOKEN": fake.access_token,
            "WHATSAPP_PHONE_NUMBER_ID": fake.phone_number_id,
            "WHATSAPP_APP_SECRET": WA_SECRET,
            "WHATSAPP_VERIFY_TOKEN": "bench",
            "WHATSAPP_GRAPH_URL": fake.graph_url,
            "WHATSAPP_WEBHOOK_PORT": str(port),
        }
        proc = _start("whatsapp", home, env, root / "whatsapp.log")
        try:
            url = f"http://127.0.0.1:{port}/webhook"
            _wait(lambda: _listening(port), 30, "the webhook")
            offset = _now() - time.monotonic() * 1000
            with httpx.Client(timeout=10) as client:
                for i in range(warmup + n):
                    text = f"ping whatsapp {i}"
                    body, headers = signed_webhook(
                        WA_SECRET, text_message_payload(WA_USER, text, wamid=f"wamid.B{i}")
                    )
                    started = _now()
                    client.post(url, content=body, headers=headers)
                    reply = _wait(
                        lambda t=text: next((s for s in fake.sent if t in (s.text or "")), None),
                        30,
                        f"reply {i}",
                    )
                    if i >= warmup:
                        samples.append(_sample(rt, text, started, reply.at * 1000 + offset))
        finally:
            _stop(proc)
    return samples


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


CHANNELS: dict[str, Callable[[Path, Path, Runtime, int, int], list[dict[str, float]]]] = {
    "telegram": run_telegram,
    "web": run_web,
    "whatsapp": run_whatsapp,
    "cli": run_cli,
}
KEYS = ("in", "intake", "in_enqueued", "out", "cli_run", "total")


def measure(channel: str, n: int, warmup: int, debounce_ms: int | None) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"latency-{channel}-"))
    home = _home(root, debounce_ms)
    processor = _start("processor", home, {}, root / "processor.log")
    rt = open_runtime(home, env={})
    try:
        _wait(
            lambda: rt.db.read_scalar("SELECT 1 FROM events WHERE type = 'processor_start'"), 30, "processor"
        )
        samples = CHANNELS[channel](root, home, rt, n, warmup)
    finally:
        rt.close()
        _stop(processor)
    shutil.rmtree(root, ignore_errors=True)
    summary: dict[str, Any] = {"channel": channel, "n": len(samples), "debounce_ms": debounce_ms}
    for key in KEYS:
        summary[key] = spread([s[key] for s in samples])
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=40, help="messages measured per channel")
    parser.add_argument("--warmup", type=int, default=3, help="messages sent first and not counted")
    parser.add_argument("--channels", default="telegram,web,whatsapp,cli")
    parser.add_argument("--debounce-ms", type=int, default=None, help="[queue] debounce_ms for the run")
    parser.add_argument("--json", type=Path, help="also write the summaries here")
    parser.add_argument(
        "--nagle", action="store_true", help="Telegram fake as the tests use it (Nagle's algorithm on)"
    )
    args = parser.parse_args()
    global NAGLE
    NAGLE = args.nagle
    results = []
    print(f"load average {os.getloadavg()[0]:.2f}; milliseconds")
    print("| channel | direction | p50 | p90 | p99 | max |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for channel in args.channels.split(","):
        summary = measure(channel.strip(), args.n, args.warmup, args.debounce_ms)
        results.append(summary)
        for key, label in (
            ("in", "update → agent start"),
            ("intake", "update → queued"),
            ("in_enqueued", "queued → agent start"),
            ("out", "agent result → platform"),
            ("cli_run", "(agent run, `cat`)"),
            ("total", "(total)"),
        ):
            s = summary[key]
            print(
                f"| {channel} | {label} | {s['p50']:.1f} | {s['p90']:.1f} | {s['p99']:.1f} | {s['max']:.1f} |"
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
