"""Pytest fixtures that several test modules share. A module takes one in by importing it by the name below
(``from tests.fixtures import telegram_fake``); the fixture's own name, the one tests ask for, is given in
each docstring. Nothing here is a fixture for a module that does not import it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.channel_support import HoldingTelegram
from tests.fakes.anthropic_api import FakeAnthropic
from tests.fakes.claude_env import claude_binary


@pytest.fixture(name="fake")
def telegram_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[HoldingTelegram]:
    """The fixture ``fake``: a fake Bot API that can hold a send (:class:`HoldingTelegram`).
    ``PTB_TIMEDELTA=1`` opts PTB 22 into timedelta durations (no deprecation warning)."""
    monkeypatch.setenv("PTB_TIMEDELTA", "1")
    with HoldingTelegram() as server:
        yield server


@pytest.fixture(scope="module", autouse=True, name="_cli_installed")
def cli_installed() -> None:
    """The fixture ``_cli_installed`` (autouse in a module that imports it): the pinned Claude CLI is there,
    or the module's tests fail at once saying how to install it (``npm ci``)."""
    claude_binary()


@pytest.fixture(name="api")
def anthropic_api() -> Iterator[FakeAnthropic]:
    """The fixture ``api``: a fake Anthropic API with its default replies (a test adds its own rules)."""
    with FakeAnthropic() as fake:
        yield fake
