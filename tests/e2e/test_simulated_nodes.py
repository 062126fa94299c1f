"""``hack/cluster.py up --nodes N``: kube-scheduler and kwok give the local control plane N
simulated nodes, on which pods are scheduled, run, complete and go away as a kubelet would make
them (``hack/kwok/stages.yaml``).

One control plane of its own for the module (it stops its processes at the end, which the
session's planes must not): operator mode, two nodes, no tally.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cluster
from tally_e2e import ControlPlane

NODES = 2


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    directory = Path(tempfile.mkdtemp(prefix="tally-e2e-nodes-"))
    try:
        with cluster.running(directory, "operator", nodes=NODES) as state:
            yield ControlPlane(
                kubeconfig=Path(state.kubeconfig), mode=state.mode, bin_dir=Path(state.bin_dir)
            )
    finally:
        cluster.down(directory, clean=True, quiet=True)


def _get(plane: ControlPlane, *args: str) -> Any:
    return json.loads(plane.kubectl("get", *args, "-o", "json").stdout)


def _until(
    probe: Callable[[], Any], ok: Callable[[Any], bool], what: str, within: float = 30.0
) -> Any:
    deadline = time.monotonic() + within
    while True:
        found = probe()
        if ok(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}; last: {found!r}")
        time.sleep(0.2)


def _namespace(plane: ControlPlane, name: str) -> None:
    """A namespace whose ``default`` ServiceAccount exists (pods are refused until it does)."""
    plane.kubectl("create", "namespace", name)
    _until(
        lambda: plane.kubectl("get", "sa", "default", "-n", name, check=False).returncode,
        lambda code: code == 0,
        f"the default ServiceAccount in {name}",
    )


def _ready(obj: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )


def test_the_nodes_are_ready_and_schedulable(plane: ControlPlane) -> None:
    nodes = _get(plane, "nodes")["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == [f"kwok-node-{i}" for i in range(NODES)]
    for node in nodes:
        assert _ready(node)
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert not node["spec"].get("taints")
        assert not node["spec"].get("unschedulable")
    state = cluster.State.load(plane.kubeconfig.parent)
    assert state is not None
    assert state.nodes == NODES
    assert set(cluster.running_components(state)) == {
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"
    }  # fmt: skip


def test_a_deployment_runs_on_the_nodes(plane: ControlPlane) -> None:
    _namespace(plane, "web")
    plane.kubectl(
        "create", "deployment", "web", "-n", "web", "--image=registry.example/web:1", "--replicas=3"
    )
    deployment = _until(
        lambda: _get(plane, "deployment", "web", "-n", "web"),
        lambda d: d.get("status", {}).get("readyReplicas") == 3,
        "3 ready replicas",
    )
    assert deployment["status"]["availableReplicas"] == 3
    pods = _get(plane, "pods", "-n", "web")["items"]
    assert len(pods) == 3
    for pod in pods:
        assert pod["spec"]["nodeName"] in {f"kwok-node-{i}" for i in range(NODES)}
        assert pod["status"]["phase"] == "Running"
        assert _ready(pod)
        assert pod["status"]["podIP"]

    # A graceful deletion (30 s by default) completes at once: the simulated kubelet confirms it.
    name = pods[0]["metadata"]["name"]
    started = time.monotonic()
    plane.kubectl("delete", "pod", name, "-n", "web", "--wait=true", "--timeout=20s")
    assert time.monotonic() - started < 15
    # ... and the ReplicaSet replaces it with a running pod.
    _until(
        lambda: _get(plane, "pods", "-n", "web")["items"],
        lambda now: (
            len(now) == 3
            and name not in {p["metadata"]["name"] for p in now}
            and all(p["status"].get("phase") == "Running" for p in now)
        ),
        "the deleted pod replaced",
    )


def test_a_restart_policy_never_pod_succeeds(plane: ControlPlane) -> None:
    _namespace(plane, "once")
    plane.kubectl("run", "once", "-n", "once", "--image=registry.example/once:1", "--restart=Never")
    pod = _until(
        lambda: _get(plane, "pod", "once", "-n", "once"),
        lambda p: p.get("status", {}).get("phase") == "Succeeded",
        "the pod Succeeded",
    )
    (status,) = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["reason"] == "Completed"


def test_a_job_completes(plane: ControlPlane) -> None:
    _namespace(plane, "batch")
    plane.kubectl("create", "job", "once", "-n", "batch", "--image=registry.example/once:1")
    _until(
        lambda: _get(plane, "job", "once", "-n", "batch"),
        lambda j: j.get("status", {}).get("succeeded") == 1,
        "the Job succeeded",
    )


def test_down_stops_the_scheduler_and_kwok(tmp_path: Path) -> None:
    state = cluster.up(tmp_path / "plane", "reference", nodes=1)
    try:
        pids = dict(state.pids)
        assert {"kube-scheduler", "kwok"} <= set(pids)
    finally:
        stopped = cluster.down(tmp_path / "plane", clean=True)
    assert stopped == list(reversed(cluster.COMPONENTS))
    assert not any(cluster._pid_runs(pid, name) for name, pid in pids.items())
