"""bench/applied.py's staleness arithmetic, on plain data (hand-computed expectations): a
namespace's own share shown after its create's answer, and every namespace showing the final
total."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

# bench/ is put on sys.path above, as the benchmarks run.
import applied  # noqa: E402

pytestmark = pytest.mark.unit

# (arrived, namespace, its own pods, the total's pods), in arrival order.
EVENTS = [
    (10.0, "a", 1, 1),
    (10.5, "b", 0, 1),
    (11.2, "a", 2, 3),
    (11.4, "b", 1, 3),
    (12.0, "c", 0, 3),
]


def test_own_share_is_the_first_event_of_its_namespace_at_or_after_the_answer() -> None:
    # a's first pod answered at 9.8, shown at 10.0; a's second at 10.9, shown at 11.2 (the
    # event at 10.0 came before the answer); b's first at 11.0, shown at 11.4.
    answers = [(9.8, "a", 1), (10.9, "a", 2), (11.0, "b", 1)]
    assert applied.own_staleness(EVENTS, answers) == pytest.approx([0.2, 0.3, 0.4])


def test_an_own_share_never_shown_is_left_out() -> None:
    assert [] == applied.own_staleness(EVENTS, [(11.5, "a", 3)])


def test_the_total_is_shown_everywhere_when_the_last_namespace_first_shows_it() -> None:
    # The final total 3: a at 11.2, b at 11.4, c at 12.0; the last create answered at 11.0.
    assert applied.total_staleness(EVENTS, ["a", "b", "c"], 3, 11.0) == pytest.approx(1.0)
    # A namespace that never showed it: not yet.
    assert applied.total_staleness(EVENTS, ["a", "b", "c", "d"], 3, 11.0) is None
