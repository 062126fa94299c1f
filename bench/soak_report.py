"""The soak's report (``bench/soak.py``): the replicas' memory as the run samples it, and what
a finished run writes, ``<name>.json`` (with its bar picture ``<name>.png``, through the
benchmarks' shared writer) and the time series ``<name>-timeline.png``.

It owns the measurements that are not invariants (each replica's VmRSS and its connections to
the API server, every 2 s; with ``--traced-every`` the SIGUSR1 that makes a traced replica
write a tracemalloc snapshot) and the figures made of the other parts' records: the
operations and their outcomes (``soak_workload``), the fault log (``soak_faults``), the
violations and convergence times (``soak_checker``).

**Memory**: the slope over the last half of the run by least squares, each process (a restarted
replica is a new one) with its own intercept and its first ``WARMUP_S`` left out; and the same
with a process that takes the Lease starting a segment there (the *steady-role* slope: a new
leader's controllers and first syncs are a step, the cost of the role, which the plain slope
reads as growth).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import signal
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import _common  # first: it puts hack/ and tests/e2e/ on sys.path for the imports below

# isort: split
import operator_process

import cluster
from soak_checker import stamp_of
from soak_faults import (
    FAULT_KINDS,
    LEASE_DURATION_S,
    RENEW_DEADLINE_S,
    RETRY_PERIOD_S,
    Replica,
)
from soak_workload import Clock

if TYPE_CHECKING:
    from soak import Soak

WARMUP_S = 60.0

Sample = tuple[float, int, float]
"""Seconds into the run, the process (or segment) it belongs to, MiB."""


# -- sampling during the run ------------------------------------------------------------------


@dataclass
class Memory:
    """Each replica's VmRSS and connections to the API server, sampled every 2 s."""

    clock: Clock
    replicas: list[Replica]
    state: cluster.State
    traced_every_s: float = 0.0
    rss: list[tuple[float, str, int, float]] = field(default_factory=list)
    connections: list[tuple[float, str, int, int]] = field(default_factory=list)
    """(seconds, replica, process, connections to the API server): the RSS's largest part
    that a burst can leave behind (~320 KiB each)."""

    @property
    def api_port(self) -> int:
        port = urlsplit(self.state.server).port
        assert port is not None, self.state.server
        return port

    async def sample_memory(self) -> None:
        every = self.traced_every_s
        next_snapshot = every
        while not self.clock.stopping:
            if every > 0 and self.clock.now() >= next_snapshot:
                next_snapshot += every
                for replica in self.replicas:
                    if replica.pid is not None and not replica.busy:
                        with contextlib.suppress(OSError):
                            os.kill(replica.pid, signal.SIGUSR1)
            for replica in self.replicas:
                pid = replica.pid
                if pid is None:
                    continue
                with contextlib.suppress(OSError, KeyError):
                    rss, _ = _common.memory_of(pid)
                    self.rss.append(
                        (self.clock.now(), replica.name, replica.incarnation, rss / 2**20)
                    )
                with contextlib.suppress(OSError, ValueError):
                    connected = len(operator_process.established_connections(pid, self.api_port))
                    self.connections.append(
                        (self.clock.now(), replica.name, replica.incarnation, connected)
                    )
            await asyncio.sleep(2.0)


# -- the memory slope ------------------------------------------------------------------------


def acquisitions_in(log: Path) -> list[float]:
    """When a replica's processes took the Lease (``leader election: … acquired lease``), in
    the order of its log (every process of the replica appends to it)."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [
        at
        for line in lines
        if "leader election:" in line and " acquired lease " in line
        for at in [stamp_of(line)]
        if at is not None
    ]


def last_half(samples: list[Sample], total: float) -> list[Sample]:
    """The (seconds, segment, MiB) samples of the run's last half, each segment's first
    ``WARMUP_S`` left out."""
    firsts: dict[int, float] = {}
    for t, segment, _ in samples:
        firsts.setdefault(segment, t)
    return [
        (t, segment, mib)
        for t, segment, mib in samples
        if t >= total / 2 and t - firsts[segment] >= WARMUP_S
    ]


def role_segments(samples: list[Sample], taken: list[float]) -> list[Sample]:
    """(seconds, process, MiB) samples renumbered by process and role: a process that takes
    the Lease at one of ``taken`` (seconds) starts a segment there, as a restarted one does.
    A new leader starts its controllers and syncs every quota: a step in memory that is the
    cost of the role, not growth."""
    segments: dict[tuple[int, int], int] = {}
    renumbered = []
    for t, process, mib in samples:
        role = sum(1 for at in taken if at <= t)
        segment = segments.setdefault((process, role), len(segments))
        renumbered.append((t, segment, mib))
    return renumbered


def slope_per_10min(samples: list[Sample]) -> float | None:
    """Least-squares slope (MiB per 10 minutes) of (seconds, process, MiB), one intercept per
    process; None with fewer than 10 samples."""
    if len(samples) < 10:
        return None
    groups: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for t, inc, mib in samples:
        groups[inc].append((t, mib))
    numerator = denominator = 0.0
    for points in groups.values():
        mean_t = sum(t for t, _ in points) / len(points)
        mean_m = sum(m for _, m in points) / len(points)
        numerator += sum((t - mean_t) * (m - mean_m) for t, m in points)
        denominator += sum((t - mean_t) ** 2 for t, _ in points)
    return round(numerator / denominator * 600, 3) if denominator else None


def memory_report(soak: Soak) -> dict[str, Any]:
    total = soak.clock.now()
    report = {}
    for replica in soak.faults.replicas:
        samples = [(t, inc, mib) for t, name, inc, mib in soak.memory.rss if name == replica.name]
        if not samples:
            continue
        taken = [at - soak.clock.t0 for at in acquisitions_in(replica.process.log)]
        half = last_half(samples, total)
        by_role = last_half(role_segments(samples, taken), total)
        connected = [c for _, name, _, c in soak.memory.connections if name == replica.name]
        report[replica.name] = {
            "api_connections_end": connected[-1] if connected else None,
            "api_connections_max": max(connected, default=None),
            "start_mib": round(samples[0][2], 1),
            "end_mib": round(samples[-1][2], 1),
            "max_mib": round(max(s[2] for s in samples), 1),
            "processes": replica.incarnation,
            "slope_mib_per_10min": slope_per_10min(half),
            "slope_samples": len(half),
            "leads_taken": len(taken),
            "steady_role_slope_mib_per_10min": slope_per_10min(by_role),
            "steady_role_samples": len(by_role),
        }
    return report


# -- the JSON --------------------------------------------------------------------------------


def report(soak: Soak, tracebacks: list[dict[str, Any]], setup_s: float) -> dict[str, Any]:
    workload, faults, checker, memory = soak.workload, soak.faults, soak.checker, soak.memory
    by_kind: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for key, count in workload.ops.items():
        op, outcome = key.rsplit(":", 1)
        by_kind[op] += count
        outcomes[outcome] += count
    fault_counts = Counter(f["kind"] for f in faults.faults)
    finite = [c for c in checker.convergence if math.isfinite(c)]
    errors = workload.errors
    return {
        "settings": {
            "minutes": soak.settings.minutes,
            "namespaces": soak.settings.namespaces,
            "clients": soak.settings.clients,
            "rate_per_s": soak.settings.rate,
            "seed": soak.settings.seed,
            "faults": list(soak.settings.faults),
            "lease_s": [LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S],
        },
        "machine": _common.machine(),
        "setup_s": round(setup_s, 1),
        "duration_s": round(soak.clock.now(), 1),
        "operations": dict(sorted(by_kind.items())),
        "outcomes": dict(outcomes),
        "operations_by_outcome": dict(sorted(workload.ops.items())),
        "faults": {kind: fault_counts.get(kind, 0) for kind in (*FAULT_KINDS, "exit")},
        "fault_log": faults.faults,
        "replica_exits": faults.exits,
        "violations": len(checker.violations),
        "violation_list": checker.violations[:100],
        "errors": len(errors),
        "errors_by_kind": dict(
            Counter(
                f"{e['status']}: {re.sub(r'[0-9]+', 'N', e['message'])[:90]}" for e in errors
            ).most_common(20)
        ),
        "errors_excused": sum(1 for e in errors if faults.excused(e["at"])),
        "error_samples": errors[:30],
        "snapshots_checked": checker.snapshots,
        "quiet_periods": len(checker.convergence),
        "convergence_s": [round(c, 2) if math.isfinite(c) else None for c in checker.convergence],
        "worst_convergence_s": round(max(finite), 2) if finite else None,
        "not_converged": len(checker.convergence) - len(finite),
        "podset_settle_s": [round(c, 2) for c in checker.podset_settle],
        "tracebacks": len(tracebacks),
        "traceback_list": tracebacks[:20],
        "memory": memory_report(soak),
        # Every 5th sample (10 s apart): (seconds, replica, process, MiB), for a later look.
        "api_connection_samples": [
            [round(t, 1), name, process, connected]
            for index, (t, name, process, connected) in enumerate(memory.connections)
            if index % 5 == 0
        ],
        "rss_samples": [
            [round(t, 1), name, process, round(mib, 1)]
            for index, (t, name, process, mib) in enumerate(memory.rss)
            if index % 5 == 0
        ],
    }


def figures(result: dict[str, Any]) -> list[_common.Figure]:
    """The figures the issue judges the soak by; none has a reference (upstream has no soak)."""
    worst = result["worst_convergence_s"]
    found = [
        _common.Figure("violations", "count", float(result["violations"]), None, target="== 0"),
        _common.Figure(
            "worst convergence", "s", math.nan if worst is None else float(worst), None,
            target="<= 10",
        ),
    ]  # fmt: skip
    for name, memory in sorted(result["memory"].items()):
        if memory["slope_mib_per_10min"] is not None:
            found.append(
                _common.Figure(
                    f"RSS slope, replica {name}", "MiB per 10 min",
                    float(memory["slope_mib_per_10min"]), None, target="< 1",
                )
            )  # fmt: skip
        if memory.get("steady_role_slope_mib_per_10min") is not None:
            found.append(
                _common.Figure(
                    f"RSS slope in a steady role, replica {name}", "MiB per 10 min",
                    float(memory["steady_role_slope_mib_per_10min"]), None, target="< 1",
                )
            )  # fmt: skip
    return found


def write(result: dict[str, Any], path: Path) -> None:
    """``soak.json`` through the benchmarks' shared writer (and its bar picture,
    ``soak.png``); the time series goes to ``soak-timeline.png`` (:func:`draw`)."""
    _common.write_results(path.stem, result, figures(result), path=path)


# -- the picture -----------------------------------------------------------------------------


def draw(soak: Soak, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rss, connected = soak.memory.rss, soak.memory.connections
    figure, (memory, ops) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for replica in soak.faults.replicas:
        for inc in sorted({inc for _, n, inc, _ in rss if n == replica.name}):
            points = [(t / 60, m) for t, n, i, m in rss if n == replica.name and i == inc]
            memory.plot(
                *zip(*points, strict=True),
                color="C0" if replica.name == "a" else "C1",
                label=f"replica {replica.name}" if inc == 1 else None,
            )
    memory.set_ylabel("RSS (MiB)")
    memory.legend(loc="upper left")
    connections = memory.twinx()
    for replica in soak.faults.replicas:
        for inc in sorted({inc for _, n, inc, _ in connected if n == replica.name}):
            counts = [(t / 60, c) for t, n, i, c in connected if n == replica.name and i == inc]
            connections.plot(
                *zip(*counts, strict=True),
                color="C0" if replica.name == "a" else "C1",
                linestyle=":",
                linewidth=0.8,
            )
    connections.set_ylabel("connections to the API server (dotted)")
    end = int(soak.clock.now()) + 1
    for outcome, color in (("ok", "C2"), ("denied", "C3"), ("gone", "C7"), ("error", "k")):
        buckets = [0] * (end // 10 + 1)
        for t, _, o in soak.workload.op_series:
            if o == outcome and t >= 0:
                buckets[int(t) // 10] += 1
        ops.plot(
            [i * 10 / 60 for i in range(len(buckets))],
            [b / 10 for b in buckets],
            color=color,
            label=outcome,
        )
    ops.set_ylabel("requests per s (10 s bins)")
    ops.set_xlabel("minutes")
    ops.legend(loc="upper left")
    colors = dict(zip((*FAULT_KINDS, "exit"), ("C4", "C5", "C6", "C8", "C9", "k"), strict=True))
    for axis in (memory, ops):
        for fault in soak.faults.faults:
            axis.axvline(
                fault["at"] / 60, color=colors[fault["kind"]], linestyle="--", linewidth=0.8
            )
    for kind, color in colors.items():
        ops.plot([], [], color=color, linestyle="--", label=kind)
    ops.legend(loc="upper left", fontsize="small", ncol=2)
    memory.set_title(
        f"soak: {soak.settings.minutes:g} min, {len(soak.checker.violations)} violations"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
