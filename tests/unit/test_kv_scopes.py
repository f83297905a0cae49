"""The kv store's scope names: unique, and families completed by a name."""

from __future__ import annotations

import pytest

from shared.storage.kv import Scope, scoped

pytestmark = pytest.mark.unit


def test_scope_values_are_unique_and_families_complete_with_a_name() -> None:
    values = [s.value for s in Scope]
    assert len(values) == len(set(values))
    assert scoped(Scope.HELD, "telegram") == "held:telegram"
    assert scoped(Scope.PROGRESS, "discord") == "progress.discord"
    with pytest.raises(ValueError):
        scoped(Scope.AGENT_RUN, "x")
