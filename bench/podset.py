"""Benchmark: scaling 0 → N → 0 pods, tally's PodSet against upstream's ReplicaSet.

Starts two local control planes with ``hack/cluster.py`` (temporary directories): one in
reference mode, whose kube-controller-manager runs with upstream's *default* client rate limit
(``--kube-api-qps=20 --kube-api-burst=30``, appended to ``hack/cluster.py``'s 1000/1000, which
the e2e tests keep), and one in operator mode with tally as a subprocess. Each scale is timed
from the PATCH of ``spec.replicas`` to the moment a watch (opened before) shows exactly the
target number of active pods the workload controls.

* **(a) rate-limited**: tally with ``TALLY_PODSET_QPS=20`` / ``TALLY_PODSET_BURST=30``, the same
  client budget as kube-controller-manager's replicaset controller, against that ReplicaSet.
  Target: tally's time ≤ 1.0x upstream's.
* **(b) unthrottled**: tally restarted without a limit, against a raw loop that creates (then
  deletes) the same number of pods with ``--concurrency`` requests in flight on the same
  control plane, through the same admission (tally's quota webhook): the API server's own
  limit. Target: tally's pods/s ≥ 0.8x the raw loop's.

The sides run one after the other, never at once (they share the machine's cores).
Prints times, pods/s, ratios, the input size and the machine, and writes the figures as JSON and
a picture beside it (``bench/results/podset.json``, ``.png``). Cleans up both control planes and
tally whatever happens.

Run: ``.venv/bin/python bench/podset.py [--pods 500] [--concurrency 64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from kubernetes_asyncio import client, config

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack"), str(REPO / "tests" / "e2e")]

from operator_process import TallyProcess  # noqa: E402
from podset_e2e import (  # noqa: E402
    PODSET,
    REPLICASET,
    OwnedPodWatch,
    Workload,
    install_podset_crd,
)

import cluster  # noqa: E402
from _common import Figure, write_results  # noqa: E402
from tally_e2e import ControlPlane, wait_for_default_service_account  # noqa: E402

UPSTREAM_QPS, UPSTREAM_BURST = 20, 30
"""kube-controller-manager's defaults for ``--kube-api-qps`` / ``--kube-api-burst``."""
TARGET_LIMITED = 1.0
TARGET_UNTHROTTLED = 0.8
WAIT_S = 600.0


async def api_client(kubeconfig: str) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    return client.ApiClient(configuration)


async def fresh_namespace(api: client.ApiClient) -> str:
    name = f"bench-{uuid.uuid4().hex[:6]}"
    await client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    await wait_for_default_service_account(api, name)
    return name


async def time_scales(api: client.ApiClient, workload: Workload, pods: int) -> tuple[float, float]:
    """Seconds for 0 → ``pods`` and for ``pods`` → 0 of one new workload."""
    namespace = await fresh_namespace(api)
    watcher = OwnedPodWatch(api, namespace, workload, "bench", ceiling=pods)
    await watcher.start()
    try:
        await workload.create(api, namespace, "bench", 0)
        await asyncio.sleep(2.0)  # the controller has seen it (an idle sync)
        started = time.perf_counter()
        await workload.scale(api, namespace, "bench", pods)
        await watcher.until(pods, within=WAIT_S)
        up = time.perf_counter() - started
        await asyncio.sleep(2.0)
        started = time.perf_counter()
        await workload.scale(api, namespace, "bench", 0)
        await watcher.until(0, within=WAIT_S)
        down = time.perf_counter() - started
        if watcher.violations:
            raise RuntimeError(f"{workload.kind}: {watcher.violations[:3]}")
    finally:
        await watcher.stop()
        with contextlib.suppress(client.ApiException):
            await client.CoreV1Api(api).delete_namespace(namespace)
    return up, down


async def time_raw_loop(api: client.ApiClient, pods: int, concurrency: int) -> tuple[float, float]:
    """Seconds for a raw loop to create ``pods`` pods, then to delete them, ``concurrency`` at
    a time (the same pod body as the workloads' template)."""
    namespace = await fresh_namespace(api)
    core = client.CoreV1Api(api)
    template = PODSET.body("raw", 0)["spec"]["template"]
    names: list[str] = []
    gate = asyncio.Semaphore(concurrency)

    async def create() -> None:
        async with gate:
            body = {"metadata": {**template["metadata"], "generateName": "raw-"}}
            created = await core.create_namespaced_pod(
                namespace, {**body, "spec": template["spec"]}
            )
            names.append(created.metadata.name)

    async def delete(name: str) -> None:
        async with gate:
            await core.delete_namespaced_pod(name, namespace)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(create() for _ in range(pods)))
        up = time.perf_counter() - started
        await asyncio.sleep(2.0)
        started = time.perf_counter()
        await asyncio.gather(*(delete(name) for name in names))
        down = time.perf_counter() - started
    finally:
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(namespace)
    return up, down


@contextlib.contextmanager
def control_plane(mode: str, extra_kcm: Sequence[str] = ()) -> Iterator[cluster.State]:
    directory = Path(tempfile.mkdtemp(prefix=f"tally-bench-podset-{mode}-"))
    try:
        # Simulated nodes: the pods are scheduled, run and are deleted as a kubelet does it, on
        # both sides, so each figure includes the pod events a cluster's kubelets make.
        state = cluster.up(
            directory, mode, extra_controller_manager_args=extra_kcm, nodes=cluster.DEFAULT_NODES
        )
        yield state
    finally:
        cluster.down(directory, clean=True, quiet=True)


def line(label: str, pods: int, seconds: float) -> str:
    return f"  {label:<44} {seconds:7.2f} s  {pods / seconds:7.1f} pods/s"


async def measure(
    reference: cluster.State, operator: cluster.State, pods: int, concurrency: int, log: Path
) -> int:
    plane = ControlPlane(Path(operator.kubeconfig), "operator", Path(operator.bin_dir))
    install_podset_crd(plane)
    reference_api = await api_client(reference.kubeconfig)
    operator_api = await api_client(operator.kubeconfig)
    limited_env = {
        "TALLY_PODSET_QPS": str(UPSTREAM_QPS),
        "TALLY_PODSET_BURST": str(UPSTREAM_BURST),
    }
    failures = 0
    try:
        tally = TallyProcess(
            Path(operator.kubeconfig), log, bin_dir=Path(operator.bin_dir), env=limited_env
        )
        tally.start()
        try:
            upstream_up, upstream_down = await time_scales(reference_api, REPLICASET, pods)
            tally_up, tally_down = await time_scales(operator_api, PODSET, pods)
        finally:
            tally.stop()
        tally = TallyProcess(Path(operator.kubeconfig), log, bin_dir=Path(operator.bin_dir))
        tally.start()
        try:
            free_up, free_down = await time_scales(operator_api, PODSET, pods)
            raw_up, raw_down = await time_raw_loop(operator_api, pods, concurrency)
        finally:
            tally.stop()
    finally:
        await reference_api.close()
        await operator_api.close()

    print(f"\nPodSet vs ReplicaSet, 0 → {pods} → 0 pods; machine: {os.cpu_count()} cores "
          f"({platform.machine()}, shared with other test runs), Python "
          f"{platform.python_version()}, Kubernetes {cluster.kubernetes_version()}")  # fmt: skip
    print(f"(a) client rate limit {UPSTREAM_QPS} qps / burst {UPSTREAM_BURST} on both sides "
          f"(kube-controller-manager's defaults; TALLY_PODSET_QPS/BURST for tally)")  # fmt: skip
    print(line(f"upstream ReplicaSet 0 → {pods}", pods, upstream_up))
    print(line(f"tally PodSet        0 → {pods}", pods, tally_up))
    print(line(f"upstream ReplicaSet {pods} → 0", pods, upstream_down))
    print(line(f"tally PodSet        {pods} → 0", pods, tally_down))
    for what, ours, theirs in (("0 → N", tally_up, upstream_up), ("N → 0", tally_down,
                                                                   upstream_down)):  # fmt: skip
        ratio = ours / theirs
        verdict = "ok" if ratio <= TARGET_LIMITED else "MISSED"
        failures += verdict != "ok"
        print(f"  {what}: tally / upstream time = {ratio:.2f}x "
              f"(target <= {TARGET_LIMITED}x) {verdict}")  # fmt: skip
    print(
        f"(b) unthrottled tally vs a raw loop of {concurrency} concurrent requests "
        "(same plane, same webhook)"
    )
    print(line(f"tally PodSet        0 → {pods}", pods, free_up))
    print(line(f"raw create loop     0 → {pods}", pods, raw_up))
    print(line(f"tally PodSet        {pods} → 0", pods, free_down))
    print(line(f"raw delete loop     {pods} → 0", pods, raw_down))
    for what, ours, theirs in (("create", free_up, raw_up), ("delete", free_down, raw_down)):
        ratio = theirs / ours  # pods/s ratio
        verdict = "ok" if ratio >= TARGET_UNTHROTTLED else "MISSED"
        failures += verdict != "ok"
        print(f"  {what}: tally / raw pods/s = {ratio:.2f}x "
              f"(target >= {TARGET_UNTHROTTLED}x) {verdict}")  # fmt: skip
    limited = f"<= {TARGET_LIMITED}x"
    unthrottled = f">= {TARGET_UNTHROTTLED}x"
    write_results(
        "podset",
        {
            "pods": pods,
            "concurrency": concurrency,
            "qps": UPSTREAM_QPS,
            "burst": UPSTREAM_BURST,
            "seconds": {
                "limited": {"tally_up": tally_up, "tally_down": tally_down,
                            "upstream_up": upstream_up, "upstream_down": upstream_down},
                "unthrottled": {"tally_up": free_up, "tally_down": free_down,
                                "raw_up": raw_up, "raw_down": raw_down},
            },
        },
        [
            Figure(f"0 → {pods} at {UPSTREAM_QPS} qps", "s", tally_up, upstream_up,
                   reference_name="ReplicaSet", target=limited),
            Figure(f"{pods} → 0 at {UPSTREAM_QPS} qps", "s", tally_down, upstream_down,
                   reference_name="ReplicaSet", target=limited),
            Figure(f"0 → {pods} unthrottled", "pods/s", pods / free_up, pods / raw_up,
                   reference_name="raw loop", better="higher", target=unthrottled),
            Figure(f"{pods} → 0 unthrottled", "pods/s", pods / free_down, pods / raw_down,
                   reference_name="raw loop", better="higher", target=unthrottled),
        ],
    )  # fmt: skip
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args(argv)
    log = Path(tempfile.mkdtemp(prefix="tally-bench-podset-")) / "tally.log"
    limit = [f"--kube-api-qps={UPSTREAM_QPS}", f"--kube-api-burst={UPSTREAM_BURST}"]
    with control_plane("reference", limit) as reference, control_plane("operator") as operator:
        failures = asyncio.run(measure(reference, operator, args.pods, args.concurrency, log))
    print(f"tally log: {log}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
