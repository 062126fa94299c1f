"""bench/scale.py's input on plain data: what each quota must show (by hand from the pods'
requests and phases) and how many simulated nodes run every pod."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

# bench/ is put on sys.path above, as the benchmarks run.
import scale  # noqa: E402
from tally.quota.quantity import Quantity  # noqa: E402

pytestmark = pytest.mark.unit


def test_each_quota_counts_the_non_terminal_pods_requests_and_every_pod() -> None:
    data = scale.Input.build(2, 20)
    want = data.expected()
    # Namespace 0 holds pods 0, 2, …, 18 (slots 0-9): slots 8 and 9 (pods 16 and 18) are
    # Succeeded and Failed. The other eight request 100m, 500m, 100m, 500m, … (index % 4 is 0 or
    # 2) plus a 50m sidecar on pods 0 and 10: 4 * 100 + 4 * 500 + 2 * 50 = 2 500m; memory by
    # (index // 3) % 3 over 64/128/256 Mi: pods 0, 2, 4, 6, 8, 10, 12, 14 -> 64, 64, 128, 256,
    # 256, 64, 128, 128 = 1 088 Mi, plus 2 * 32 Mi of sidecars = 1 152 Mi.
    assert {
        "pods": Quantity.from_int(8),
        "count/pods": Quantity.from_int(10),
        "requests.cpu": Quantity.from_milli(2500),
        "requests.memory": Quantity.from_int(1152 * 2**20),
        "count/configmaps": Quantity.from_int(scale.CONFIGMAPS_PER_NAMESPACE + 1),
    } == want["scale-0000"]
    # Namespace 1: slots 7 and 8 ((slot + 1) % 10 in 8, 9) are terminal, pods 15 and 17.
    assert Quantity.from_int(8) == want["scale-0001"]["pods"]


def test_enough_nodes_for_every_pods_cpu_with_a_fifth_to_spare() -> None:
    # 10 000 pods cycling over 100, 250, 500, 1000 m: 4 625 cores, plus 2 000 sidecars of 50m:
    # 100 cores; 4 725 * 1.2 = 5 670 cores over 1 000-core nodes: 6.
    assert 6 == scale.Input.build(1000, 10_000).nodes()
    assert scale.cluster.DEFAULT_NODES == scale.Input.build(10, 20).nodes()


def test_the_cluster_quota_total_sums_every_namespace() -> None:
    import scale_startup

    data = scale.Input.build(2, 20)
    totals = scale_startup.cluster_totals(data.expected())
    # Namespace 0 (above): 8 pods running or pending of 10; namespace 1 likewise 8 of 10.
    assert Quantity.from_int(16) == totals["pods"]
    assert Quantity.from_int(20) == totals["count/pods"]
    assert Quantity.from_int(2 * (scale.CONFIGMAPS_PER_NAMESPACE + 1)) == totals["count/configmaps"]
    status = {"status": {"total": {"used": {name: str(v) for name, v in totals.items()}}}}
    assert scale_startup.cluster_quota_correct(status, totals)
    status["status"]["total"]["used"]["pods"] = "15"
    assert not scale_startup.cluster_quota_correct(status, totals)
    assert not scale_startup.cluster_quota_correct({"status": {}}, totals)


def test_a_window_keeps_the_creates_sent_within_it() -> None:
    import scale_startup
    from scale_startup import Create

    creates = [
        Create(0.5, 0.010, 201),  # before the window
        *(Create(1.0 + i / 100, (i + 1) / 1000, 201) for i in range(99)),  # 1..99 ms
        Create(1.995, 2.0, 0),  # no answer within the window's last moment
        Create(2.0, 0.001, 201),  # the window's end is open
    ]
    span = scale_startup.window(creates, 1.0, 2.0)
    assert (100, 1) == (span.creates, span.failed)
    # Nearest rank over 1, 2, …, 99, 2000 ms: the 50th is 50 ms, the 99th 99 ms.
    assert (50.0, 99.0, 2000.0) == (span.p50_ms, span.p99_ms, span.max_ms)
    empty = scale_startup.window(creates, 5.0, 6.0)
    assert (0, None) == (empty.creates, empty.p99_ms)


def test_the_start_ups_syncs_leave_out_the_periodic_resync() -> None:
    """The 150 000-pod run of 2026-11-28 read 20 131 syncs for 10 000 quotas at 390 s: the
    controllers started at 84 s, so the first full resync (every quota once more) was due at
    384 s, inside the run. The start-up's count is the last read before that."""
    final, sampled = "20131.0 syncs, 815.58 s in total", "10131.0 syncs, 700.00 s in total"
    assert scale.startup_syncs(final, sampled, lease_s=84.4, end_s=390.0) == sampled
    # A run over before the resync could begin (the 50 000-pod runs ended at 203 s).
    assert scale.startup_syncs(final, sampled, lease_s=32.5, end_s=202.7) == final
    # Within the margin before the resync: the last read, not the final count.
    assert scale.startup_syncs(final, sampled, lease_s=0.0, end_s=295.0, period=300.0) == sampled
    # No lease seen: nothing says when the controllers started; the final count.
    assert scale.startup_syncs(final, sampled, lease_s=None, end_s=390.0) == final


def test_the_series_counts_the_start_ups_syncs_where_the_run_has_them() -> None:
    import scale_series

    document = {
        "pods": 150000, "namespaces": 10000, "quotas": 10000, "when": None,
        "upstream": {"kcm_rss": 2**20, "kcm_peak": 2**20},
        "tally": {
            "rss": 2**20, "peak": 2**20,
            "syncs": "20131.0 syncs, 815.58 s in total",
            "syncs_in_startup": "10131.0 syncs, 700.00 s in total",
        },
    }  # fmt: skip
    assert scale_series.row_of(document, "abc")["syncs_per_quota"] == pytest.approx(1.0131)
    del document["tally"]["syncs_in_startup"]  # type: ignore[attr-defined]
    assert scale_series.row_of(document, "abc")["syncs_per_quota"] == pytest.approx(2.0131)


def test_a_sync_count_that_could_not_be_read_is_no_reading() -> None:
    # "?": /metrics did not answer within the read's time (a start-up's busy loop); the run
    # keeps its last reading instead of stopping.
    assert scale.syncs_reading("20131.0", "815.58") == "20131 syncs, 815.58 s in total"
    assert scale.syncs_reading("?", "?") is None
    assert scale.syncs_reading("10", "") is None


def test_convergence_is_held_to_30_s_up_to_30_000_pods_and_60_s_at_the_envelope() -> None:
    # Issue 30's bounds: 30 s for the 30 000-pod run, 60 s at 150 000 pods.
    assert scale.target_convergence_s(10_000) == 30.0
    assert scale.target_convergence_s(30_000) == 30.0
    assert scale.target_convergence_s(50_000) == 60.0
    assert scale.target_convergence_s(150_000) == 60.0


def test_a_readiness_reason_is_noted_when_its_words_change_not_its_figures() -> None:
    reasons: list[tuple[float, str]] = []
    scale.note_reason(reasons, 1.0, "starting: the first recalculation (12 left)")
    scale.note_reason(reasons, 1.5, "starting: the first recalculation (3 left)")
    scale.note_reason(reasons, 2.0, "starting: Kopf's first listing has yet to deliver 7 of 9 pods")
    scale.note_reason(reasons, 2.5, "starting: Kopf's first listing has yet to deliver 1 of 9 pods")
    scale.note_reason(reasons, 3.0, "starting: the event loop ran 0.250 s late 0.1 s ago")
    assert [at for at, _ in reasons] == [1.0, 2.0, 3.0]
    assert reasons[1][1].endswith("7 of 9 pods")  # the first answer of each reason is kept
