"""The soak's judges (bench/soak_checker.py, bench/soak_report.py), on plain data: what counts
as admitted past a quota, what a status that differs from the truth is, and the memory slope
(hand-computed expectations); and bench/soak.py's arguments."""

from __future__ import annotations

import calendar
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import builders

BENCH = Path(__file__).resolve().parents[3] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

# bench/ is put on sys.path above, as the benchmarks run.
import soak  # noqa: E402
import soak_checker  # noqa: E402
import soak_report  # noqa: E402

pytestmark = pytest.mark.unit

T0 = calendar.timegm(time.strptime("2026-11-25T05:00:00Z", "%Y-%m-%dT%H:%M:%SZ"))


def pod_entry(name: str, created_s: int, phase: str = "Pending") -> tuple[str, dict[str, Any]]:
    """The soak's record of a pod: ``("pods", the pod as listed)``."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + created_s))
    return "pods", builders.pod(
        name, namespace="ns", creation_timestamp=stamp, bare=True, phase=phase
    )


def nodeport(name: str, created_s: int, ports: int) -> tuple[str, dict[str, Any]]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + created_s))
    return "services", {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": stamp},
        "spec": {"type": "NodePort", "ports": [{"port": 80 + i} for i in range(ports)]},
    }


@pytest.mark.parametrize(
    ("name", "objects", "hard", "stable_since", "over"),
    [
        ("at the limit", [pod_entry("a", 10), pod_entry("b", 20)], {"pods": "2"}, T0, []),
        ("one past, the last created after the hard was set",
         [pod_entry("a", 10), pod_entry("b", 20), pod_entry("c", 30)], {"pods": "2"}, T0,
         ["pods/ns/c"]),
        # Lowered at +25 s over three existing pods: nothing was admitted past it.
        ("over, every object older than the hard",
         [pod_entry("a", 10), pod_entry("b", 20), pod_entry("c", 21)], {"pods": "2"}, T0 + 25, []),
        # Creation times are whole seconds: a pod stamped in the second the hard changed may
        # have been admitted before it.
        ("over, the last created in the second the hard changed",
         [pod_entry("a", 10), pod_entry("b", 20), pod_entry("c", 25)], {"pods": "2"}, T0 + 25.5,
         []),
        ("over, the last created the second after",
         [pod_entry("a", 10), pod_entry("b", 20), pod_entry("c", 26)], {"pods": "2"}, T0 + 25.5,
         ["pods/ns/c"]),
        ("a finished pod uses nothing",
         [pod_entry("a", 10), pod_entry("b", 20, "Succeeded"), pod_entry("c", 30)], {"pods": "2"},
         T0, []),
        # Two NodePort services of 2 ports each: 4 node ports against 3.
        ("node ports are counted per port",
         [nodeport("s", 10, 2), nodeport("t", 20, 2)], {"services.nodeports": "3"}, T0,
         ["services/ns/t"]),
    ],
)  # fmt: skip
def test_over_admitted(
    name: str,
    objects: list[tuple[str, dict[str, Any]]],
    hard: dict[str, str],
    stable_since: float,
    over: list[str],
) -> None:
    found = soak_checker.over_admitted(objects, hard, stable_since)
    assert over == [f["object"] for f in found], name


def test_used_differs_names_each_resource_off_the_truth() -> None:
    hard = {"pods": "5", "requests.storage": "3Gi", "secrets": "4"}
    status = {"pods": "2", "requests.storage": "1Gi"}
    truth = {"pods": 2, "requests.storage": 2 * 2**30, "secrets": 0}
    assert {
        "requests.storage": ("1Gi", 2 * 2**30),
        "secrets": (None, 0),  # no status for it yet is a difference too
    } == soak_checker.used_differs(status, hard, truth)


def test_the_slope_is_common_to_every_process_and_ignores_their_levels() -> None:
    # Two processes (a restart between), each growing 1 MiB a minute from its own level:
    # 10 MiB per 10 minutes, whatever the jump at the restart.
    samples = [(60.0 * m, 1, 100.0 + m) for m in range(6)]
    samples += [(60.0 * m, 2, 50.0 + m) for m in range(6, 12)]
    assert 10.0 == soak_report.slope_per_10min(samples)
    assert None is soak_report.slope_per_10min(samples[:9])  # too few to say


def test_fault_kinds_are_checked_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        soak.main(["--faults", "kill_leader,unplug"])
    assert exited.value.code == 2
    assert "unknown fault kinds ['unplug']" in capsys.readouterr().err


def test_a_lead_taken_starts_a_segment_of_its_own(tmp_path: Path) -> None:
    log = tmp_path / "tally-a.log"
    log.write_text(
        "[2026-11-26 10:00:00,000] tally.machinery.lead [INFO    ] leader election: x tries to "
        "acquire lease ns/tally\n"
        "[2026-11-26 10:00:30,500] tally.machinery.lead [INFO    ] leader election: x acquired "
        "lease ns/tally\n"
        "[2026-11-26 10:01:00,000] tally.app.runtime    [INFO    ] something else\n"
    )
    start = time.mktime(time.strptime("2026-11-26 10:00:00", "%Y-%m-%d %H:%M:%S"))
    taken = [at - start for at in soak_report.acquisitions_in(log)]
    assert taken == [30.5]
    # Process 1 follows until 30.5 s, then leads; process 2 (a restart) follows.
    samples = [(0.0, 1, 100.0), (30.0, 1, 100.0), (40.0, 1, 106.0), (50.0, 2, 90.0)]
    assert soak_report.role_segments(samples, taken) == [
        (0.0, 0, 100.0),
        (30.0, 0, 100.0),
        (40.0, 1, 106.0),
        (50.0, 2, 90.0),
    ]


def test_a_step_at_a_lead_taken_is_no_slope_in_a_steady_role() -> None:
    # 10 minutes: flat at 100 MiB as a follower, a 6 MiB step when the lead is taken at 300 s,
    # flat again. One process: its slope sees the step; split by role, both halves are flat.
    samples = [(float(t), 1, 100.0 if t < 300 else 106.0) for t in range(0, 600, 10)]
    total = 600.0
    half = soak_report.last_half(samples, total)
    assert half[0][0] == 300.0  # the last half, the process's warm-up long over
    step_slope = soak_report.slope_per_10min(half)
    assert step_slope == 0.0  # the step fell at the start of the half: nothing after it
    early = [(float(t), 1, 100.0 if t < 450 else 106.0) for t in range(0, 600, 10)]
    assert (soak_report.slope_per_10min(soak_report.last_half(early, total)) or 0) > 10
    by_role = soak_report.last_half(soak_report.role_segments(early, [450.0]), total)
    # The segment that starts at 450 s loses its first WARMUP_S (60 s) like a new process.
    assert min(t for t, segment, _ in by_role if segment == 1) == 510.0
    assert soak_report.slope_per_10min(by_role) == 0.0
