"""Message ids: ``prefix_`` + 8 lowercase alphanumerics."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.ids import KNOWN_PREFIXES, derived_id, is_message_id, new_id

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("prefix", sorted(KNOWN_PREFIXES))
def test_new_ids_have_the_seed_shape(prefix: str) -> None:
    ids = {new_id(prefix) for _ in range(200)}
    assert len(ids) == 200
    for value in ids:
        head, _, tail = value.rpartition("_")
        assert head == prefix and len(tail) == 8 and tail.isalnum() and tail == tail.lower()
        assert is_message_id(value)


@given(st.lists(st.text(max_size=20), min_size=1, max_size=4))
def test_derived_ids_are_stable_and_well_formed(parts: list[str]) -> None:
    a = derived_id("heartbeat", *parts)
    assert a == derived_id("heartbeat", *parts) and is_message_id(a)


def test_derived_ids_differ_per_slot_and_bad_prefixes_are_refused() -> None:
    assert derived_id("heartbeat", "a", "1") != derived_id("heartbeat", "a", "2")
    for bad in ("", "Api", "a-b", "1x"):
        with pytest.raises(ValueError):
            new_id(bad)
    assert not is_message_id("api_ABCDEFGH") and not is_message_id("api_abc") and not is_message_id("../x")
