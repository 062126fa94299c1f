"""The soak's replicas and the faults done to them (``bench/soak.py``): chaos under the churn.

It owns the two tally replicas (``Replica``: a ``TallyProcess`` each, leader election on, run
from a copy of ``operator/`` taken at the start so that edits to the working tree never reach
a restarted replica), which of them leads, their supervision (a replica that exits on its own,
as a leader that could not renew its Lease does by design, is restarted as a kubelet would and
counted) and the faults, one per cycle, every kind in turn:

* ``kill_replica``: the follower SIGKILLed, restarted;
* ``kill_leader``: the Lease holder SIGKILLed, restarted as a candidate;
* ``restart_apiserver``: the API server stopped and started again;
* ``pause_etcd``: SIGSTOP/SIGCONT for 2-3.5 s;
* ``cut_connections``: every webhook connection reset at the balancer.

It keeps the fault log, and with it the windows in which a failed request or a traceback is
excused (:meth:`Faults.excused`): from a second before a fault until ``FAULT_SETTLE_S`` after
it recovered. The checker (``soak_checker``) asks; the faults know when they happened.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import signal
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from _common import REPO  # first: it puts hack/ and tests/e2e/ on sys.path for the imports below

# isort: split
import operator_process
from balancer import RoundRobinBalancer

import cluster

if TYPE_CHECKING:
    from soak_workload import Clock

FAULT_KINDS = ("kill_replica", "kill_leader", "restart_apiserver", "pause_etcd", "cut_connections")
OWN_NAMESPACE = "tally-system"
LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S = 7, 5.0, 1.0
"""Shorter than the Deployment's 15/10/2 so that a killed leader is replaced within a cycle;
the renew deadline outlasts the longest etcd pause (3.5 s) plus one retry period."""
FAULT_SETTLE_S = 5.0
"""Seconds after a fault's recovery during which a failed request is excused: pooled
connections to a restarted API server fail once, a Lease changes hands."""
EXIT_LEAD_S = 10.0
"""A replica that exits on its own (a leader that lost its Lease) began stopping up to a renew
deadline before the supervisor saw it gone: its webhook port closed first."""


# -- the replicas --------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    process: operator_process.TallyProcess
    incarnation: int = 0
    busy: bool = False
    """A fault owns it right now: the supervisor leaves it alone."""
    ready: bool = False
    """Its webhook serves: the balancer sends it connections (a Service sends them to ready
    endpoints only)."""

    @property
    def pid(self) -> int | None:
        p = self.process.process
        return p.pid if p is not None and p.poll() is None else None


def leader_value(replica: Replica) -> float | None:
    try:
        with urllib.request.urlopen(replica.process.metrics_url, timeout=3) as response:
            text = response.read().decode()
    except OSError:
        return None
    found = re.search(r"^tally_leader\{[^}]*\} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def snapshot_operator(into: Path, traced: bool = False) -> Path:
    """A copy of ``operator/`` to run the replicas from; its ``main.py``, or with ``traced``
    a copy of ``bench/_traced_operator.py`` beside it that loads it under tracemalloc."""
    target = into / "operator"
    shutil.copytree(REPO / "operator", target, ignore=shutil.ignore_patterns("__pycache__"))
    if not traced:
        return target / "main.py"
    (into / "bench").mkdir()
    return Path(shutil.copy(REPO / "bench" / "_traced_operator.py", into / "bench"))


def replica_env(work: Path, balancer_port: int) -> dict[str, str]:
    """The replicas' settings: tally from the copy in ``work``, leader election with the short
    Lease above, one webhook configuration naming the balancer, kept when a replica exits."""
    return {
        "PYTHONPATH": str(work / "operator"),
        "TALLY_NAMESPACE": OWN_NAMESPACE,
        "TALLY_LEADER_ELECTION": "true",
        "TALLY_LEADER_ELECTION_LEASE_DURATION": str(LEASE_DURATION_S),
        "TALLY_LEADER_ELECTION_RENEW_DEADLINE": str(RENEW_DEADLINE_S),
        "TALLY_LEADER_ELECTION_RETRY_PERIOD": str(RETRY_PERIOD_S),
        "TALLY_WEBHOOK_REMOVE_ON_EXIT": "false",
        "TALLY_WEBHOOK_CERT_SECRET": f"{OWN_NAMESPACE}/tally-webhook-tls",
        "TALLY_WEBHOOK_URL_PORT": str(balancer_port),
    }


# -- the faults ----------------------------------------------------------------------------


@dataclass
class Faults:
    state: cluster.State
    replicas: list[Replica]
    balancer: RoundRobinBalancer
    rng: random.Random
    clock: Clock
    logs: Path
    traced_every_s: float = 0.0
    faults: list[dict[str, Any]] = field(default_factory=list)
    exits: list[dict[str, Any]] = field(default_factory=list)

    async def leader(self) -> Replica | None:
        values = await asyncio.gather(*(asyncio.to_thread(leader_value, r) for r in self.replicas))
        leading = [r for r, v in zip(self.replicas, values, strict=True) if v == 1.0]
        return leading[0] if len(leading) == 1 else None

    async def wait_leader(self, within: float = 60.0) -> Replica | None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if (found := await self.leader()) is not None:
                return found
            await asyncio.sleep(0.5)
        return None

    async def start_replica(self, replica: Replica) -> None:
        replica.incarnation += 1
        if self.traced_every_s > 0:
            snapshots = self.logs / f"snapshots-{replica.name}-{replica.incarnation}"
            snapshots.mkdir(parents=True, exist_ok=True)
            replica.process.extra_env["TALLY_BENCH_SNAPSHOTS"] = str(snapshots)
        await asyncio.to_thread(replica.process.start, 120.0, registered=False)
        replica.ready = True

    async def inject(self, kind: str) -> None:
        started = time.time()
        detail: dict[str, Any] = {}
        disrupted_until: float | None = None
        """When what the fault broke works again: the kill, the API server ready again, etcd
        resumed (a replica restarting is not a disruption: the balancer skips it)."""
        if kind in ("kill_replica", "kill_leader"):
            leader = await self.wait_leader()
            if kind == "kill_leader":
                target = leader or self.rng.choice(self.replicas)
            else:
                target = next((r for r in self.replicas if r is not leader), self.replicas[0])
            target.busy = True
            try:
                assert target.process.process is not None
                target.ready = False
                target.process.process.send_signal(signal.SIGKILL)
                await asyncio.to_thread(target.process.process.wait)
                disrupted_until = time.time()
                detail["replica"] = target.name
                await asyncio.sleep(1.0)
                await self.start_replica(target)
            finally:
                target.busy = False
            new_leader = await self.wait_leader()
            detail["leader_after"] = new_leader.name if new_leader else None
        elif kind == "restart_apiserver":
            detail["unavailable_s"] = round(
                await asyncio.to_thread(cluster.restart_apiserver, self.state), 2
            )
        elif kind == "pause_etcd":
            pid = self.state.pids["etcd"]
            seconds = self.rng.uniform(2.0, 3.5)
            os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)
            detail["paused_s"] = round(seconds, 2)
        elif kind == "cut_connections":
            detail["connections"] = self.balancer.cut()
        recovered = time.time()
        self.faults.append(
            {
                "kind": kind,
                "at": round(started - self.clock.t0, 2),
                "disrupted_until": round((disrupted_until or recovered) - self.clock.t0, 2),
                "recovered": round(recovered - self.clock.t0, 2),
                **detail,
            }
        )
        print(
            f"  [{self.clock.now():6.0f} s] fault {kind} {detail} ({recovered - started:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    async def supervise(self) -> None:
        """Restart a replica that exited on its own, as the kubelet restarts a container."""
        while not self.clock.stopping:
            await asyncio.sleep(1.0)
            for replica in self.replicas:
                process = replica.process.process
                if replica.busy or process is None or process.poll() is None:
                    continue
                replica.busy = True
                replica.ready = False
                try:
                    at = time.time()
                    self.exits.append(
                        {
                            "replica": replica.name,
                            "at": round(at - self.clock.t0, 2),
                            "code": process.returncode,
                        }
                    )
                    print(
                        f"  [{self.clock.now():6.0f} s] {replica.name} exited "
                        f"({process.returncode}); restarting",
                        file=sys.stderr,
                        flush=True,
                    )
                    await self.start_replica(replica)
                    # The exit is a fault of its own: requests around it are excused like a kill's.
                    self.faults.append(
                        {
                            "kind": "exit",
                            "at": round(at - self.clock.t0, 2),
                            "disrupted_until": round(at - self.clock.t0, 2),
                            "recovered": round(self.clock.now(), 2),
                            "replica": replica.name,
                        }
                    )
                finally:
                    replica.busy = False

    def excused(self, at: float) -> bool:
        return any(
            f["at"] - (EXIT_LEAD_S if f["kind"] == "exit" else 1.0)
            <= at
            <= f["disrupted_until"] + FAULT_SETTLE_S
            for f in self.faults
        )
