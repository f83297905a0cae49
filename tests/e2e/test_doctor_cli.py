"""`agentpost doctor` and `agentpost trace` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def run(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTPOST_", "TELEGRAM_", "DISCORD_"))}
    base.update(AGENTPOST_HOME=str(home), NO_COLOR="1", HOME=str(home), **env)
    return subprocess.run([AGENTPOST, *args], env=base, capture_output=True, text=True, timeout=60)


def test_doctor_reports_missing_token_cli_and_unsafe_address(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text(
        '[api]\nhost = "0.0.0.0"\nallow_open_loopback = true\n[agents.assistant]\nprovider = "codex"\n'
        '[agents.helper]\nprovider = "command"\ncommand = ["/nonexistent/agent-cli"]\n'
        '[agents.asker]\nprovider = "claude"\npermission_mode = "ask"\n'
        '[agents.reader]\nprovider = "codex"\npermission_mode = "ask"\n'
    )
    proc = run(home, "doctor", "--json", PATH="/usr/bin:/bin", AGENTPOST_CODEX_BIN="")
    assert proc.returncode == 1, proc.stderr
    found = {(c["area"], c["name"]): c for c in json.loads(proc.stdout)}
    assert found[("settings", "settings.toml")]["level"] == "ok"
    assert found[("security", "web API address")]["level"] == "fail"
    assert "allow_open_loopback" in found[("security", "web API address")]["fix"]
    # The open API is the one way back to no token, and doctor warns about it.
    assert found[("security", "API token")]["level"] == "warn"
    assert "allow_open_loopback" in found[("security", "API token")]["detail"]
    assert found[("agents", "agent assistant (codex)")]["level"] == "fail"
    # "ask" is Claude Code's permission prompts, answered in the chat; no other provider has them.
    assert found[("agents", "agent asker asks")]["level"] == "ok"
    assert "no answer within 600 s is a denial" in found[("agents", "agent asker asks")]["detail"]
    reader = found[("agents", "agent reader asks")]
    assert reader["level"] == "fail" and "not available for codex agents" in reader["detail"]
    assert "codex" in found[("agents", "agent assistant (codex)")]["detail"]
    assert found[("agents", "agent helper (command)")]["level"] == "fail"
    assert found[("channels", "telegram")]["level"] == "warn"
    assert "TELEGRAM_BOT_TOKEN" in found[("channels", "telegram")]["detail"]
    text = run(home, "doctor", PATH="/usr/bin:/bin").stdout
    assert "FAIL" in text and "fix:" in text and "problem(s)" in text


def test_doctor_is_clean_for_a_safe_setup_and_flags_a_dead_channel(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    fake_cli = tmp_path / "agent.sh"
    fake_cli.write_text("#!/bin/sh\necho hi\n")
    fake_cli.chmod(0o755)
    (home / "settings.toml").write_text(
        f'[agents.assistant]\nprovider = "command"\ncommand = ["{fake_cli}"]\n'
    )
    assert run(home, "init", "--force").returncode == 0
    (home / "settings.toml").write_text(
        f'[agents.assistant]\nprovider = "command"\ncommand = ["{fake_cli}"]\n'
    )
    clean = run(home, "doctor", "--json")
    assert clean.returncode == 0, clean.stdout
    # `init` made the API token, in a file only this user may read.
    checks = {(c["area"], c["name"]): c for c in json.loads(clean.stdout)}
    assert checks[("security", "API token")]["level"] == "ok"
    assert "asks for a token" in checks[("security", "API token")]["detail"]
    assert (home / "api-token").stat().st_mode & 0o777 == 0o600
    text = run(home, "doctor").stdout
    assert "the API asks for a token" in text
    broken = run(home, "doctor", "--json", TELEGRAM_BOT_TOKEN="t", TELEGRAM_API_BASE_URL="http://127.0.0.1:9")
    found = {(c["area"], c["name"]): c for c in json.loads(broken.stdout)}
    assert broken.returncode == 1 and "unreachable" in found[("channels", "telegram")]["detail"]


def test_doctor_names_a_bad_settings_key(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "settings.toml").write_text("[queue]\nlease_seconds = -5\n")
    proc = run(home, "doctor")
    assert proc.returncode == 1 and "queue.lease_seconds" in proc.stdout


def test_trace_tells_a_queued_message_and_an_unknown_id(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert run(home, "init").returncode == 0
    mid = run(home, "send", "trace me").stdout.strip()
    story = json.loads(run(home, "trace", mid, "--json").stdout)
    assert [e["type"] for e in story["events"]] == ["message_received"]
    assert "waiting for a processor" in story["verdict"]
    unknown = run(home, "trace", "cli_zzzzzzzz")
    assert unknown.returncode == 1 and "unknown" in unknown.stdout


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[processor]\nbusy_policy = "x"\n', "processor.busy_policy: Input should be"),
        ('[processor]\nbusy_polcy = "collect"\n', "processor.busy_polcy: unknown key"),
        ("[processor]\nbusy_policy = ", "at line 2, column 15"),
    ],
    ids=["bad-value", "unknown-key", "toml-syntax"],
)
def test_doctor_and_send_refuse_what_the_processor_refuses(tmp_path: Path, text: str, named: str) -> None:
    home = tmp_path / "home"
    assert run(home, "init").returncode == 0
    (home / "settings.toml").write_text(text)
    # The processor refuses the file when it starts...
    processor = run(home, "run", "processor")
    assert processor.returncode == 2 and named in processor.stderr, processor.stderr
    # ... and so do doctor and send, with the same words, before anything is queued.
    report = run(home, "doctor", "--json")
    found = {(c["area"], c["name"]): c for c in json.loads(report.stdout)}
    assert report.returncode == 1
    assert found[("settings", "settings.toml")]["level"] == "fail"
    assert named in found[("settings", "settings.toml")]["detail"]
    shown = run(home, "doctor").stdout
    assert named in shown and "valid:" not in shown
    sent = run(home, "send", "hello")
    assert sent.returncode == 2 and named in sent.stderr and sent.stdout == "", sent.stderr
    if "line" in named:  # a syntax error shows the line, and no key is named to correct
        assert "2 | busy_policy =" in shown and "2 | busy_policy =" in sent.stderr
        assert "fix: fix the TOML syntax on line 2" in shown and "key" not in shown.split("fix:")[1]
        assert "end of document" not in shown + sent.stderr
