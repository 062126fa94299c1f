"""bench/_common.write_results and bench/plot.py: the JSON every benchmark writes reads back as
written, and a picture is drawn beside it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _common  # noqa: E402 (bench/ is put on sys.path above, as the benchmarks run)
import plot  # noqa: E402

pytestmark = pytest.mark.unit

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_write_results_round_trips_and_draws(tmp_path: Path) -> None:
    figures = [
        _common.Figure("throughput", "creates/s", 150.0, 200.0, better="higher", target=">= 1.0x"),
        _common.Figure("p99 latency", "ms", 90.0, 60.0, target="<= 1.2x"),
        _common.Figure("resident memory", "MiB", 140.0, None),
        _common.Figure("CPU per create", "ms", 2.0, 0.5, reference_name="plain Python"),
    ]
    path = _common.write_results(
        "demo", {"creates": 1000, "sides": {"tally": [1, 2]}}, figures,
        path=tmp_path / "out" / "demo.json",
    )  # fmt: skip

    assert tmp_path / "out" / "demo.json" == path
    written = json.loads(path.read_text())
    assert "demo" == written["benchmark"]
    assert written["when"].endswith("+00:00")
    assert written["machine"].startswith("nproc=")
    assert 1000 == written["creates"]
    assert {"tally": [1, 2]} == written["sides"]
    assert [
        {"name": "throughput", "unit": "creates/s", "tally": 150.0, "reference": 200.0,
         "reference_name": "upstream", "better": "higher", "target": ">= 1.0x"},
        {"name": "p99 latency", "unit": "ms", "tally": 90.0, "reference": 60.0,
         "reference_name": "upstream", "better": "lower", "target": "<= 1.2x"},
        {"name": "resident memory", "unit": "MiB", "tally": 140.0, "reference": None,
         "reference_name": "upstream", "better": "lower", "target": None},
        {"name": "CPU per create", "unit": "ms", "tally": 2.0, "reference": 0.5,
         "reference_name": "plain Python", "better": "lower", "target": None},
    ] == written["figures"]  # fmt: skip
    assert figures == [_common.Figure(**figure) for figure in written["figures"]]

    picture = tmp_path / "out" / "demo.png"
    assert picture.read_bytes().startswith(PNG_SIGNATURE)
    assert picture.stat().st_size > 1000


def test_a_result_may_keep_its_own_machine_line(tmp_path: Path) -> None:
    path = _common.write_results(
        "demo", {"machine": "measured elsewhere"}, [], path=tmp_path / "demo.json"
    )
    assert "measured elsewhere" == json.loads(path.read_text())["machine"]
    assert (tmp_path / "demo.png").stat().st_size > 0


def test_ratio_text() -> None:
    # 90 / 60 = 1.5; 150 / 200 = 0.75
    assert "tally / upstream = 1.50x (lower is better)" == plot.ratio_text(
        {"tally": 90.0, "reference": 60.0}
    )
    assert "tally / raw loop = 0.75x (higher is better)" == plot.ratio_text(
        {"tally": 150.0, "reference": 200.0, "reference_name": "raw loop", "better": "higher"}
    )
    assert "" == plot.ratio_text({"tally": 1.0, "reference": None})


@pytest.mark.parametrize(
    ("value", "text"),
    [
        pytest.param(71.0, "71.0", id="two-digits"),
        pytest.param(2.4, "2.40", id="one-digit"),
        pytest.param(0.0123, "0.0123", id="small"),
        pytest.param(1234.4, "1,234", id="thousands"),
        pytest.param(0.0, "0", id="zero"),
    ],
)
def test_value_text_keeps_three_significant_digits(value: float, text: str) -> None:
    assert text == plot.value_text(value)


def test_plot_main_redraws_and_skips_old_results(tmp_path: Path) -> None:
    _common.write_results("one", {}, [_common.Figure("p50", "ms", 1.0, 2.0)],
                          path=tmp_path / "one.json")  # fmt: skip
    (tmp_path / "one.png").unlink()
    (tmp_path / "old.json").write_text(json.dumps({"machine": "x", "cases": []}))

    assert 0 == plot.main([str(tmp_path / "one.json"), str(tmp_path / "old.json")])
    assert (tmp_path / "one.png").read_bytes().startswith(PNG_SIGNATURE)
    assert not (tmp_path / "old.png").exists()
