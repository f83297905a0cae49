"""The captured CLI failures (``tests/fixtures/cli_errors``) still match what the installed claude CLI prints:
a fast subset is provoked again against the fake API and compared field by field, so the classifier's tests
cannot keep passing on output the real CLI no longer produces."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.fixtures import cli_installed  # noqa: F401  (fixture)
from workers.errors import diagnose
from workers.providers.base import StreamState
from workers.providers.claude import ClaudeProvider

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cli_errors"


def _capture_module() -> ModuleType:
    # A script beside its fixtures (tests/fixtures.py owns the module name ``tests.fixtures``).
    spec = importlib.util.spec_from_file_location("cli_errors_capture", FIXTURES / "capture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executed
    spec.loader.exec_module(module)
    return module


capture = _capture_module()


def _shape(run: dict[str, Any]) -> dict[str, Any]:
    """What must not drift: the lines' kinds, the final result's fields, the exit code and stderr."""
    events = [json.loads(line) for line in run["stdout"]]
    result: dict[str, Any] = next((e for e in events if e.get("type") == "result"), {})
    assistant: dict[str, Any] = next((e for e in events if e.get("type") == "assistant"), {})
    return {
        "exit_code": run["exit_code"],
        "lines": [(e.get("type"), e.get("subtype")) for e in events],
        "retries": [(e.get("attempt"), e.get("error_status"), e.get("error")) for e in events if e.get("subtype") == "api_retry"],
        "error": assistant.get("error"),
        "result": {
            k: result.get(k)
            for k in ("subtype", "is_error", "terminal_reason", "api_error_status", "api_error_type", "result")
        },
        "stderr": run["stderr"],
    }  # fmt: skip


def _diagnosis(run: dict[str, Any]) -> tuple[str, str]:
    provider, state = ClaudeProvider(), StreamState()
    for line in run["stdout"]:
        provider.parse_line(line, state)
    diagnosis = diagnose(provider.finish(state, run["exit_code"], run["stderr"]))
    return diagnosis.kind, diagnosis.explanation


def test_the_fixtures_were_captured_with_the_installed_cli() -> None:
    installed = capture.cli_version(capture.claude_binary())
    for path in sorted(FIXTURES.glob("*.json")):
        recorded = json.loads(path.read_text())["cli_version"]
        assert recorded == installed, (
            f"{path.name} was captured with claude {recorded}, {installed} is installed: "
            "run `.venv/bin/python tests/fixtures/cli_errors/capture.py` and review the diff"
        )


@pytest.mark.parametrize("name", capture.FAST)
def test_the_installed_cli_still_prints_what_was_captured(name: str) -> None:
    fresh = capture.run_case(name, capture.CASES[name], capture.claude_binary())
    recorded = json.loads((FIXTURES / f"{name}.json").read_text())
    assert _shape(fresh) == _shape(recorded)
    assert _diagnosis(fresh) == _diagnosis(recorded)
