"""Live previews: from the model's first streamed token to the first visible text in the chat, per channel.

Real processes on one SQLite home: ``agentpost run processor`` running the real Claude CLI against the fake
Anthropic API (tests/fakes), and ``agentpost run telegram`` / ``agentpost run discord`` against the platform
fakes, all in this process. Each message is answered by a reply the fake API streams as ``--parts`` text
deltas ``--interval`` seconds apart (default 8 × 0.5 s); messages go one at a time per channel, each after
the previous answer arrived.

Per message, on one clock (``time.monotonic()``; the fakes record on it):

- ``first visible``: the fake API wrote the reply's first text delta → the platform fake received the first
  send or edit carrying that text (the CLI, the processor's coalesced write, the adapter's wake-up and send);
- ``edits/s``: preview edits of the message while it streamed, per second of streaming, and the most edits
  any one second saw (the platforms allow about one a second per chat).

    .venv/bin/python bench/preview_latency.py --n 20 [--channels telegram,discord] [--json out.json]
        [--no-preview]   # the same with previews off (the text is first visible with the final)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from measure import spread  # noqa: E402

from tests.channel_support import Proc, discord_env, telegram_env, wait_for  # noqa: E402
from tests.fakes.anthropic_api import Chunked, FakeAnthropic  # noqa: E402
from tests.fakes.discord_api import FakeDiscord  # noqa: E402
from tests.fakes.telegram_api import FakeTelegram  # noqa: E402
from tests.liveness_support import claude_home, cli_env  # noqa: E402

TG_CHAT, DC_USER, DC_DM = 42, 5001, 7001

#: A platform's view for the bench: push a message, and the (time, text, is_edit) of what the bot showed.
Shown = list[tuple[float, str, bool]]


def telegram_shown(fake: FakeTelegram) -> Shown:
    return [
        (c.at, c.text or "", c.method == "editMessageText")
        for c in fake.sent
        if c.chat_id == TG_CHAT and c.method in ("sendMessage", "editMessageText")
    ]


def discord_shown(fake: FakeDiscord) -> Shown:
    return [
        (s.at, s.content or "", s.kind == "edit")
        for s in fake.sent
        if s.channel_id == DC_DM and s.kind in ("message", "edit")
    ]


def measure(
    api: FakeAnthropic,
    channel: str,
    n: int,
    parts: int,
    interval: float,
    push: Callable[[str], None],
    shown: Callable[[], Shown],
) -> dict[str, Any]:
    first_visible: list[float] = []
    rates: list[float] = []
    peaks: list[int] = []
    for i in range(n):
        tokens = [f"[{channel} {i} part {k}] " for k in range(parts)]
        api.add_rule(f"bench {channel} {i}", Chunked(tokens, interval=interval), times=1)
        push(f"bench {channel} {i}")
        whole = "".join(tokens).strip()
        wait_for(lambda w=whole: any(t == w for _, t, _ in shown()), 90, f"{channel} answer {i}")  # type: ignore[misc]
        streamed = [at for at, text in api.deltas if text in tokens]
        start, end = streamed[0], streamed[-1]
        mine = [(at, edit) for at, text, edit in shown() if tokens[0] in text]
        first_visible.append((mine[0][0] - start) * 1000)
        edits = [at for at, edit in mine if edit and start <= at <= end]
        rates.append(len(edits) / max(end - start, 1e-3))
        peaks.append(max((sum(1 for b in edits if a <= b < a + 1.0) for a in edits), default=0))
    return {
        "first_visible_ms": spread(first_visible),
        "edits_per_s_while_streaming": round(sum(rates) / len(rates), 2),
        "most_edits_in_one_second": max(peaks),
        "n": n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--channels", default="telegram,discord")
    parser.add_argument("--parts", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--no-preview", action="store_true", help="previews off: the text is first visible with the final"
    )
    args = parser.parse_args()
    chosen = [c.strip() for c in args.channels.split(",") if c.strip()]
    os.environ.setdefault("PTB_TIMEDELTA", "1")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="preview-bench-") as tmp_name:
        tmp = Path(tmp_name)
        channels = {
            "telegram": {"allowlist": [str(TG_CHAT)], "poll_timeout_seconds": 1},
            "discord": {"allowlist": [str(DC_USER)], "guild_ready_timeout_seconds": 0.1},
        }
        if args.no_preview:
            for section in channels.values():
                section["preview"] = False
        home = claude_home(
            tmp, f"sqlite:///{tmp / 'agentpost.db'}", channels={c: channels[c] for c in chosen}
        )
        with FakeAnthropic() as api, FakeTelegram() as tg, FakeDiscord(heartbeat_interval_ms=5_000) as dc:
            env = cli_env(api, tmp)
            env["PATH"] = os.environ.get("PATH", env["PATH"])
            procs = [Proc("processor", home, env, tmp / "processor.log")]
            try:
                if "telegram" in chosen:
                    procs.append(Proc("telegram", home, telegram_env(tg), tmp / "telegram.log"))
                    results["telegram"] = measure(
                        api,
                        "telegram",
                        args.n,
                        args.parts,
                        args.interval,
                        lambda text: tg.push_text(TG_CHAT, text) and None,
                        lambda: telegram_shown(tg),
                    )
                if "discord" in chosen:
                    procs.append(Proc("discord", home, discord_env(dc), tmp / "discord.log"))
                    wait_for(lambda: dc.identifies > 0, 30, "the Discord adapter to identify")
                    results["discord"] = measure(
                        api,
                        "discord",
                        args.n,
                        args.parts,
                        args.interval,
                        lambda text: dc.push_message(DC_DM, text, DC_USER, "alice") and None,
                        lambda: discord_shown(dc),
                    )
            finally:
                for proc in procs:
                    proc.stop()
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
