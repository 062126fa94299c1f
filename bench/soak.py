"""Soak and chaos: steady churn on an operator-mode control plane with two tally replicas (leader
election on) behind a round-robin balancer, while tally, the API server and etcd fail
underneath; invariants checked from the objects themselves.

    .venv/bin/python bench/soak.py --minutes 30   # bench/results/soak.json, .png, -timeline.png

What runs (all on loopback, all real: ``hack/cluster.py``'s etcd, kube-apiserver and
kube-controller-manager, two ``kopf run`` replicas started from a copy of ``operator/`` taken at
the start, so edits to the working tree during a long run never reach a restarted replica):

* **churn** (``soak_workload.py``): ``--clients`` concurrent clients at ``--rate`` requests per
  second in total over ``--namespaces`` namespaces, each with a ResourceQuota on pods, services
  (NodePort and LoadBalancer counted), PVCs and storage, configmaps and secrets, four fifths of
  them labelled into the five teams of five ClusterQuotas (pods, services): creates (most aimed
  at quotas that are already full, since creates outnumber deletes), updates and deletes of
  every kind; quotas and ClusterQuotas changed, quotas deleted and created again; namespaces
  relabelled from team to team; PodSets (in namespaces of their own) scaled; namespaces with
  a quota and objects created and deleted.
* **faults** (``soak_faults.py``), one per cycle at a random moment, every kind in turn
  (shuffled per round): ``kill_replica`` (the follower SIGKILLed, restarted), ``kill_leader``
  (the Lease holder SIGKILLed, restarted as a candidate), ``restart_apiserver``, ``pause_etcd``
  (SIGSTOP/SIGCONT for 2-3.5 s), ``cut_connections`` (every webhook connection reset at the
  balancer). A replica that exits on its own (a leader that could not renew its Lease exits by
  design) is restarted, as a kubelet would, and counted.
* **invariants** (``soak_checker.py``, never from tally's own view): every few seconds, from
  LISTs, nothing admitted past a quota's hard; at the end of each cycle churn stops and every
  quota's status must equal the truth recomputed from a fresh LIST within
  ``CONVERGENCE_BOUND_S`` (the time it took is recorded), and every PodSet must have exactly
  ``spec.replicas`` pods. Every request must end in an admission, a quota's 403 or (a delete
  or update of something already gone) a 404, except from a second before a fault until
  ``FAULT_SETTLE_S`` after it recovered. No replica's log may hold a traceback outside those
  windows.
* **memory** (``soak_report.py``, which also writes the JSON and the pictures): each replica's
  VmRSS every 2 s; the slope over the last half of the run by least squares, each process (a
  restarted replica is a new one) with its own intercept and its first ``WARMUP_S`` left out;
  and the same with a process that takes the Lease starting a segment there (the
  *steady-role* slope). ``--faults none`` runs the churn alone (processes that live the whole
  run); ``--traced-every S`` runs the replicas under tracemalloc with a snapshot every S
  seconds (what grows in the Python heap, as ``bench/memory.py`` reads it).

This module parses the arguments, sets the run up (control plane, CRDs, balancer, replicas)
and runs the schedule of cycles.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common  # first: it puts hack/ and tests/e2e/ on sys.path for the imports below

# isort: split
import operator_process
from balancer import RoundRobinBalancer

import cluster
from _common import REPO, Raw, api_client, kubectl
from soak_checker import Checker
from soak_faults import FAULT_KINDS, OWN_NAMESPACE, Faults, Replica, replica_env, snapshot_operator
from soak_report import Memory, draw, report, write
from soak_workload import Clock, Workload

RESULTS = REPO / "bench" / "results"
CYCLE_S = 100.0
"""About how long each cycle (churn, one fault, more churn, a quiet period) lasts: 30 minutes
give 18 cycles, every fault kind three times or more, and each replica a few minutes between
kills for its memory slope."""


@dataclass
class Settings:
    minutes: float = 10.0
    namespaces: int = 50
    clients: int = 8
    rate: float = 25.0
    seed: int = 0
    out_dir: Path = RESULTS
    name: str = "soak"
    logs: Path = Path(tempfile.gettempdir()) / "tally-soak-logs"
    faults: tuple[str, ...] = FAULT_KINDS
    """The fault kinds injected in turn; none gives a run of churn alone, whose processes live
    the whole run (the memory slope of a process that no fault restarts)."""
    traced_every_s: float = 0.0
    """When positive, the replicas run under tracemalloc and write a snapshot of their traced
    Python memory this often into ``<logs>/snapshots-<replica>-<process>/`` (to find what
    grows; tracing slows tally and costs memory, so such a run's figures are not the soak's)."""


@dataclass
class Soak:
    """One run's parts: they share one clock and one random generator."""

    settings: Settings
    clock: Clock
    rng: random.Random
    workload: Workload
    faults: Faults
    checker: Checker
    memory: Memory

    @classmethod
    def build(
        cls,
        settings: Settings,
        state: cluster.State,
        raw: Raw,
        replicas: list[Replica],
        balancer: RoundRobinBalancer,
    ) -> Soak:
        clock = Clock()
        rng = random.Random(settings.seed)
        workload = Workload(raw, rng, clock, settings.namespaces, settings.clients, settings.rate)
        faults = Faults(
            state, replicas, balancer, rng, clock, settings.logs, settings.traced_every_s
        )
        checker = Checker(raw, clock, workload, faults)
        memory = Memory(clock, replicas, state, settings.traced_every_s)
        return cls(settings, clock, rng, workload, faults, checker, memory)

    async def run(self) -> None:
        """The schedule: cycles of churn with one fault at a random moment, each ending in a
        quiet period, then a final quiet period."""
        clock = self.clock
        total = self.settings.minutes * 60
        kinds = self.settings.faults
        cycles = max(len(kinds), round(total / CYCLE_S))
        cycle = total / cycles
        order: list[str | None] = [] if kinds else [None] * cycles
        while len(order) < cycles:
            round_: list[str | None] = list(kinds)
            self.rng.shuffle(round_)
            order.extend(round_)
        workers = [
            asyncio.create_task(self.workload.churn_client()) for _ in range(self.settings.clients)
        ]
        workers += [
            asyncio.create_task(task())
            for task in (
                self.workload.namespace_churn,
                self.faults.supervise,
                self.memory.sample_memory,
                self.checker.checker,
            )
        ]
        clock.t0 = time.time()
        clock.churning.set()
        try:
            for index in range(cycles):
                begin = index * cycle
                churn_until = begin + cycle * 0.8
                await asyncio.sleep(
                    max(0.0, begin + self.rng.uniform(0.1, 0.35) * cycle - clock.now())
                )
                fault = order[index]
                if fault is not None:
                    await self.faults.inject(fault)
                await asyncio.sleep(max(3.0, churn_until - clock.now()))
                await self.checker.quiet()
                print(
                    f"  [{clock.now():6.0f} s] cycle {index + 1}/{cycles}: converged in "
                    f"{self.checker.convergence[-1]:.2f} s; ops {sum(self.workload.ops.values())}, "
                    f"violations {len(self.checker.violations)}",
                    file=sys.stderr,
                    flush=True,
                )
                await asyncio.sleep(max(0.0, (index + 1) * cycle - clock.now()))
            await self.checker.quiet(final=True)
        finally:
            clock.stopping = True
            clock.churning.set()
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)


# -- main ----------------------------------------------------------------------------------


async def soak(settings: Settings) -> dict[str, Any]:
    """One run; the report (also written as JSON and a picture to ``settings.out_dir``)."""
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tally-soak-")))
        entry_point = snapshot_operator(work, traced=settings.traced_every_s > 0)
        print("starting an operator-mode control plane ...", file=sys.stderr, flush=True)
        state = stack.enter_context(_common.control_plane("operator"))
        for crd in ("clusterquotas", "podsets"):
            kubectl(state, "apply", "-f", str(REPO / "crds" / f"{crd}.tally.dev.yaml"))
            kubectl(
                state,
                "wait",
                "--for=condition=Established",
                f"crd/{crd}.tally.dev",
                "--timeout=60s",
            )
        kubectl(state, "create", "namespace", OWN_NAMESPACE)
        replicas: list[Replica] = []
        balancer = RoundRobinBalancer(
            lambda: [r.process.webhook_port for r in replicas if r.ready and r.pid]
        )
        await balancer.start()
        env = replica_env(work, balancer.port)
        logs = settings.logs
        shutil.rmtree(logs, ignore_errors=True)
        for name in ("a", "b"):
            process = operator_process.TallyProcess(
                Path(state.kubeconfig),
                logs / f"tally-{name}.log",
                bin_dir=Path(state.bin_dir),
                env=env,
                entry_point=entry_point,
            )
            stack.callback(process.kill)
            replicas.append(Replica(name, process))
        api = await api_client(state.kubeconfig, pool=settings.clients * 4 + 20)
        try:
            raw = Raw(api)
            soak_ = Soak.build(settings, state, raw, replicas, balancer)
            await asyncio.gather(*(soak_.faults.start_replica(r) for r in replicas))
            if await soak_.faults.wait_leader() is None:
                raise RuntimeError("no leader")
            await _common.until(
                raw,
                "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/tally.dev",
                lambda c: all(
                    str(balancer.port) in w["clientConfig"].get("url", "") for w in c["webhooks"]
                ),
                "the webhook configuration naming the balancer",
            )
            await soak_.workload.setup()
            setup_s = time.monotonic() - began
            print(
                f"set up in {setup_s:.0f} s; soaking for {settings.minutes:g} min",
                file=sys.stderr,
                flush=True,
            )
            await soak_.run()
            tracebacks = soak_.checker.judge_errors_and_logs()
            result = report(soak_, tracebacks, setup_s)
        finally:
            await balancer.close()
            await api.close()
        write(result, settings.out_dir / f"{settings.name}.json")
        draw(soak_, settings.out_dir / f"{settings.name}-timeline.png")
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--namespaces", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rate", type=float, default=25.0, help="requests per second, all clients")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--name", default="soak")
    parser.add_argument("--logs", type=Path, default=Settings.logs, help="the replicas' logs")
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help="comma-separated fault kinds injected in turn, or none (default: every kind)",
    )
    parser.add_argument(
        "--traced-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="run the replicas under tracemalloc, a snapshot this often (to find what grows)",
    )
    args = parser.parse_args(argv)
    faults = tuple(k for k in args.faults.split(",") if k and k != "none")
    unknown = sorted(set(faults) - set(FAULT_KINDS))
    if unknown:
        parser.error(f"unknown fault kinds {unknown}: choose from {', '.join(FAULT_KINDS)}")
    settings = Settings(
        args.minutes,
        args.namespaces,
        args.clients,
        args.rate,
        args.seed,
        args.out_dir,
        args.name,
        args.logs,
        faults,
        args.traced_every,
    )
    result = asyncio.run(soak(settings))
    summary = {
        k: result[k]
        for k in (
            "operations",
            "outcomes",
            "faults",
            "violations",
            "worst_convergence_s",
            "tracebacks",
            "memory",
        )
    }
    print(json.dumps(summary, indent=1))
    return 1 if result["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
