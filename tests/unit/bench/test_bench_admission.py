"""bench/admission.py's arithmetic, on plain data: CPU per create per process, and the Kopf pod
watch measured beside tally's side without being counted in it (hand-computed expectations)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import admission  # noqa: E402 (bench/ is put on sys.path above, as the benchmarks run)

pytestmark = pytest.mark.unit


def measured(cpu_s: dict[str, float], creates: int = 500, busy_s: float = 2.0) -> dict[str, float]:
    record = admission.Measured(latencies=[0.01] * creates, busy_s=busy_s)
    record.add_cpu(dict.fromkeys(cpu_s, 10.0), {name: 10.0 + s for name, s in cpu_s.items()})
    summary = record.summary()
    return {"total": summary["cpu_ms_per_create_total"], **summary["cpu_ms_per_create"]}


def test_cpu_per_create_is_each_process_cpu_over_the_creates() -> None:
    # 500 creates: 0.5 s of tally's CPU is 1.0 ms each, 1.0 s of the API server's 2.0 ms.
    assert {"total": 3.0, "tally": 1.0, "kube-apiserver": 2.0} == pytest.approx(
        measured({"tally": 0.5, "kube-apiserver": 1.0})
    )


def test_the_kopf_watch_is_reported_but_not_counted_in_the_side() -> None:
    figures = measured({"tally": 0.5, "kube-apiserver": 1.0, admission.KOPF_WATCH: 0.2})
    assert {"total": 3.0, "tally": 1.0, "kube-apiserver": 2.0, "kopf-watch": 0.4} == (
        pytest.approx(figures)
    )


def test_the_kopf_watch_figure_compares_tally_with_the_watch_alone() -> None:
    (figure,) = admission.report_kopf_watch({"tally": 1.5, admission.KOPF_WATCH: 0.4})
    assert (1.5, 0.4, "Kopf pod watch") == (figure.tally, figure.reference, figure.reference_name)
    assert [] == admission.report_kopf_watch({"tally": 1.5})
