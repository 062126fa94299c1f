"""bench/soak.py's judges, on plain data: what counts as admitted past a quota, what a status
that differs from the truth is, and the memory slope (hand-computed expectations)."""

from __future__ import annotations

import calendar
import sys
import time
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import soak  # noqa: E402 (bench/ is put on sys.path above, as the benchmarks run)

pytestmark = pytest.mark.unit

T0 = calendar.timegm(time.strptime("2026-11-25T05:00:00Z", "%Y-%m-%dT%H:%M:%SZ"))


def pod(name: str, created_s: int, phase: str = "Pending") -> tuple[str, dict[str, Any]]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + created_s))
    return "pods", {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": stamp},
        "status": {"phase": phase},
    }


def nodeport(name: str, created_s: int, ports: int) -> tuple[str, dict[str, Any]]:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + created_s))
    return "services", {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": stamp},
        "spec": {"type": "NodePort", "ports": [{"port": 80 + i} for i in range(ports)]},
    }


@pytest.mark.parametrize(
    ("name", "objects", "hard", "stable_since", "over"),
    [
        ("at the limit", [pod("a", 10), pod("b", 20)], {"pods": "2"}, T0, []),
        ("one past, the last created after the hard was set",
         [pod("a", 10), pod("b", 20), pod("c", 30)], {"pods": "2"}, T0, ["pods/ns/c"]),
        # Lowered at +25 s over three existing pods: nothing was admitted past it.
        ("over, every object older than the hard",
         [pod("a", 10), pod("b", 20), pod("c", 21)], {"pods": "2"}, T0 + 25, []),
        # Creation times are whole seconds: a pod stamped in the second the hard changed may
        # have been admitted before it.
        ("over, the last created in the second the hard changed",
         [pod("a", 10), pod("b", 20), pod("c", 25)], {"pods": "2"}, T0 + 25.5, []),
        ("over, the last created the second after",
         [pod("a", 10), pod("b", 20), pod("c", 26)], {"pods": "2"}, T0 + 25.5, ["pods/ns/c"]),
        ("a finished pod uses nothing",
         [pod("a", 10), pod("b", 20, "Succeeded"), pod("c", 30)], {"pods": "2"}, T0, []),
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
    found = soak.over_admitted(objects, hard, stable_since)
    assert over == [f["object"] for f in found], name


def test_used_differs_names_each_resource_off_the_truth() -> None:
    hard = {"pods": "5", "requests.storage": "3Gi", "secrets": "4"}
    status = {"pods": "2", "requests.storage": "1Gi"}
    truth = {"pods": 2, "requests.storage": 2 * 2**30, "secrets": 0}
    assert {
        "requests.storage": ("1Gi", 2 * 2**30),
        "secrets": (None, 0),  # no status for it yet is a difference too
    } == soak.used_differs(status, hard, truth)


def test_the_slope_is_common_to_every_process_and_ignores_their_levels() -> None:
    # Two processes (a restart between), each growing 1 MiB a minute from its own level:
    # 10 MiB per 10 minutes, whatever the jump at the restart.
    samples = [(60.0 * m, 1, 100.0 + m) for m in range(6)]
    samples += [(60.0 * m, 2, 50.0 + m) for m in range(6, 12)]
    assert 10.0 == soak.slope_per_10min(samples)
    assert None is soak.slope_per_10min(samples[:9])  # too few to say


def test_fault_kinds_are_checked_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        soak.main(["--faults", "kill_leader,unplug"])
    assert exited.value.code == 2
    assert "unknown fault kinds ['unplug']" in capsys.readouterr().err
