"""tally.charges.first_syncs.RecentKeys: keys noted within the last ``window`` seconds, on a fake
clock (``now[0]``)."""

from __future__ import annotations

import pytest

from tally.charges.first_syncs import RecentKeys

pytestmark = pytest.mark.unit


def test_a_key_is_recent_for_the_window_and_not_after() -> None:
    now = [100.0]
    keys: RecentKeys[str] = RecentKeys(5.0, clock=lambda: now[0])
    keys.note("a")
    now[0] = 104.9
    assert keys.recent("a")
    now[0] = 105.0  # exactly the window later: no longer within it
    assert not keys.recent("a")
    assert 0 == len(keys)


def test_a_key_noted_again_is_recent_from_its_last_note() -> None:
    now = [0.0]
    keys: RecentKeys[str] = RecentKeys(5.0, clock=lambda: now[0])
    keys.note("a")
    now[0] = 1.0
    keys.note("b")
    now[0] = 4.0
    keys.note("a")  # again: now later than b
    now[0] = 6.5  # b's window is over, a's (from 4.0) is not
    assert not keys.recent("b")
    assert keys.recent("a")
    now[0] = 9.0
    assert not keys.recent("a")


def test_many_keys_expire_in_the_order_they_were_noted() -> None:
    now = [0.0]
    keys: RecentKeys[int] = RecentKeys(10.0, clock=lambda: now[0])
    for index in range(10_000):
        now[0] = index / 1000  # 10 000 keys over 10 s
        keys.note(index)
    assert 10_000 == len(keys)
    now[0] = 15.0  # those noted at 5.0 s or before (0 to 5 000) are over
    assert 4_999 == len(keys)
    assert not keys.recent(5_000)
    assert keys.recent(5_001)


def test_a_forgotten_key_is_not_recent() -> None:
    keys: RecentKeys[str] = RecentKeys(5.0, clock=lambda: 0.0)
    keys.note("a")
    keys.forget("a")
    assert not keys.recent("a")
