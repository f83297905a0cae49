"""Limits per agent: sizes read from settings with errors that name the key, edits through the settings
API keep them, the words a chat gets when a limit stopped a run, and how a run's end is judged
(workers/limits.py; the real cgroups and rlimits are tried in tests/e2e/test_limits.py)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from shared.settings.model import AgentLimits, SettingsError, load_settings
from tests.homes import write_settings
from workers.errors import diagnose
from workers.limits import Hold, LimitHit, size_words
from workers.providers.base import RunResult

pytestmark = pytest.mark.unit

MIB, GIB = 1 << 20, 1 << 30


@pytest.mark.parametrize(
    ("written", "size"),
    [
        ('"512MiB"', 512 * MIB),
        ('"2GiB"', 2 * GIB),
        ('"1.5GB"', 1_500_000_000),
        ('"200 mib"', 200 * MIB),
        ("1073741824", GIB),
        ('"100000000"', 100_000_000),
    ],
)
def test_sizes_are_read_in_the_units_people_write(tmp_path: Path, written: str, size: int) -> None:
    write_settings(
        tmp_path,
        f"[queue]\ndefault_agent = 'coder'\n[agents.coder]\nlimits = {{ memory = {written}, disk = {written} }}\n",
    )
    limits = load_settings(tmp_path, env={}).agents["coder"].limits
    assert (limits.memory, limits.disk, limits.processes) == (size, size, 256)


def test_the_defaults_suit_a_claude_run(tmp_path: Path) -> None:
    write_settings(tmp_path, "[queue]\ndefault_agent = 'coder'\n[agents.coder]\n")
    assert load_settings(tmp_path, env={}).agents["coder"].limits == AgentLimits(
        memory=2 * GIB, processes=256, disk=5 * GIB
    )


@pytest.mark.parametrize(
    ("written", "key", "words"),
    [
        (
            'memory = "lots"',
            "agents.coder.limits.memory",
            "'lots' is not a size like '512MiB', '2GiB', '1.5GB'",
        ),
        ('disk = "5 parsecs"', "agents.coder.limits.disk", "is not a size like"),
        ("disk = true", "agents.coder.limits.disk", "True is not a size"),
        ('memory = "1MiB"', "agents.coder.limits.memory", "less than 64 MiB, too little for an agent's CLI"),
        ("processes = 2", "agents.coder.limits.processes", "greater than or equal to 8"),
        ("procs = 10", "agents.coder.limits.procs", "unknown key"),
    ],
)
def test_a_wrong_limit_is_refused_naming_the_key(tmp_path: Path, written: str, key: str, words: str) -> None:
    write_settings(tmp_path, f"[queue]\ndefault_agent = 'coder'\n[agents.coder]\nlimits = {{ {written} }}\n")
    with pytest.raises(SettingsError) as caught:
        load_settings(tmp_path, env={})
    problems = "\n".join(caught.value.problems)
    assert key in problems and words in problems, problems


def test_limits_are_edited_through_the_settings_api_and_kept_by_an_agent_edit(tmp_path: Path) -> None:
    """``PUT /api/settings`` merges the patch (merge_settings); ``PUT /api/agents/X`` rewrites the agent from
    its dumped settings (put_agent): both keep the limits valid."""
    from shared.settings.edit import merge_settings, put_agent

    write_settings(tmp_path, "[queue]\ndefault_agent = 'coder'\n[agents.coder]\n")
    settings = load_settings(tmp_path, env={})
    with pytest.raises(SettingsError, match=r"agents\.coder\.limits\.memory"):
        merge_settings(settings, {"agents": {"coder": {"limits": {"memory": "much"}}}})
    merge_settings(settings, {"agents": {"coder": {"limits": {"memory": "1GiB", "processes": 100}}}})
    settings = load_settings(tmp_path, env={})
    assert settings.agents["coder"].limits == AgentLimits(memory=GIB, processes=100)
    values = settings.file.agents["coder"].model_dump(exclude_defaults=True) | {"model": "opus"}
    put_agent(settings, "coder", values)
    edited = load_settings(tmp_path, env={}).agents["coder"]
    assert (edited.model, edited.limits) == ("opus", AgentLimits(memory=GIB, processes=100))


@pytest.mark.parametrize(
    ("size", "words"),
    [
        (512 * MIB, "512 MiB"),
        (2 * GIB, "2 GiB"),
        (1_500_000_000, "1.4 GiB"),
        (200 * 1024, "200 KiB"),
        (12, "12 bytes"),
    ],
)
def test_sizes_are_said_as_people_read_them(size: int, words: str) -> None:
    assert size_words(size) == words


@pytest.mark.parametrize(
    ("hit", "explanation", "advice"),
    [
        (
            LimitHit("memory", 512 * MIB, "coder"),
            "the agent ran out of memory (limit 512 MiB)",
            "Ask for something that needs less memory (smaller inputs, one thing at a time), or the operator "
            "can raise `[agents.coder] limits.memory` in settings.toml; then type /retry.",
        ),
        (
            LimitHit("processes", 64, "coder"),
            "the agent tried to run more processes at once than it may (limit 64)",
            "Ask for something that starts fewer programs at once, or the operator can raise "
            "`[agents.coder] limits.processes` in settings.toml; then type /retry.",
        ),
        (
            LimitHit("disk", 200 * MIB, "coder"),
            "the agent tried to write a file larger than it may (limit 200 MiB)",
            "Ask for a smaller file, or the output in parts, or the operator can raise "
            "`[agents.coder] limits.disk` in settings.toml; then type /retry.",
        ),
    ],
)
def test_a_run_stopped_by_a_limit_is_explained_once_and_not_retried(
    hit: LimitHit, explanation: str, advice: str
) -> None:
    # Without the limit the same end is an ordinary crash, tried again.
    crashed = RunResult(ok=False, error="command exited with code 137: no error output", exit_code=137)
    assert diagnose(crashed).kind == "transient"
    crashed.limit = hit
    diagnosis = diagnose(crashed)
    assert (diagnosis.kind, diagnosis.explanation, diagnosis.advice) == ("permanent", explanation, advice)


LIMITS = AgentLimits(memory=512 * MIB, processes=64, disk=200 * MIB)


def test_the_launcher_is_told_the_cgroups_or_else_every_rlimit() -> None:
    held = Hold("coder", LIMITS, 1, (Path("/cg/memory/run"), Path("/cg/pids/run")))
    assert held.launcher_options() == [
        "--cgroup", "/cg/memory/run", "--cgroup", "/cg/pids/run", "--rlimit", f"fsize={200 * MIB}",
    ]  # fmt: skip
    assert Hold("coder", LIMITS).launcher_options() == [
        "--rlimit", f"fsize={200 * MIB}", "--rlimit", f"as={512 * MIB}", "--rlimit", "nproc=64",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("exit_code", "stderr", "which"),
    [
        (128 + signal.SIGXFSZ, "", "disk"),  # a shell's (or bubblewrap's) report of a SIGXFSZ death
        (-signal.SIGXFSZ, "", "disk"),  # the CLI itself killed by it
        (1, "OSError: [Errno 27] File too large", "disk"),  # a program that ignores SIGXFSZ
        (1, "Traceback (most recent call last):\nMemoryError", "memory"),
        (1, "sh: 1: Cannot fork", "processes"),
        (1, "BlockingIOError: [Errno 11] Resource temporarily unavailable", "processes"),
        (1, "Error: something else broke", None),
        (137, "", None),  # a SIGKILL is the memory limit only when the cgroup counted an OOM kill
    ],
)
def test_a_runs_end_is_put_down_to_the_limit_that_stopped_it(
    exit_code: int, stderr: str, which: str | None
) -> None:
    hit = Hold("coder", LIMITS).verdict(exit_code, stderr)
    assert (hit.which if hit else None) == which
