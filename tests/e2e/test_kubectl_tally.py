"""``kubectl tally`` against the real control plane, with tally running (operator mode).

The plugin runs as a user would run it: the installed console script (and once through kubectl,
which finds it on PATH), a subprocess with its own KUBECONFIG. What it prints is checked against
what tally's quota controller wrote in the quotas' status (read here through the API), and
against figures worked out by hand from the pods each test creates; never against the plugin's
own arithmetic. ``why`` is checked against the API server: the object it says fits is then
created for real, and the one it says does not is refused with the same message.

Pods' cpu requests are chosen so each figure is easy to check by hand; see each test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import yaml
from clusterquota_e2e import Team, wait_for_status
from kubernetes_asyncio import client
from podset_e2e import install_podset_crd

import cluster
from builders import IMAGE, NO_SCHEDULER
from tally_e2e import ControlPlane, eventually, set_pod_status, token_kubeconfig

pytest_plugins = ["clusterquota_e2e"]

KUBECTL_TALLY: Final = Path(sys.executable).parent / "kubectl-tally"
"""The console script ``pip install`` put beside the interpreter (pyproject's
``[project.scripts]``)."""
RUN_TIMEOUT_S: Final = 120.0
WITHIN_S: Final = 20.0


@pytest.fixture(scope="module", autouse=True)
def podset_crd(control_plane: ControlPlane) -> None:
    install_podset_crd(control_plane)


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def kubectl_tally(
    kubeconfig: Path, *args: str, stdin: str | None = None, via: list[str] | None = None
) -> Run:
    """Run the plugin (or ``via``, a command that runs it, such as kubectl) as a subprocess,
    its output piped: no colour, no progress."""
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    env.pop("NO_COLOR", None)
    command = [*(via or [str(KUBECTL_TALLY)]), *args]
    done = await asyncio.to_thread(
        subprocess.run,
        command,
        input=stdin,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def pod_body(
    name: str,
    *cpus: str | None,
    init_cpu: str | None = None,
    played: bool = False,
) -> dict[str, Any]:
    """A pod with one container per cpu request (None: no requests at all); ``played``: unbound,
    its status written by the test (``set_pod_status``), not by a kubelet."""

    def container(index: int, cpu: str | None, prefix: str = "c") -> dict[str, Any]:
        resources = {} if cpu is None else {"requests": {"cpu": cpu}}
        return {"name": f"{prefix}{index}", "image": IMAGE, "resources": resources}

    spec: dict[str, Any] = {"containers": [container(i, cpu) for i, cpu in enumerate(cpus)]}
    if init_cpu is not None:
        spec["initContainers"] = [container(0, init_cpu, "init")]
    if played:
        spec["schedulerName"] = NO_SCHEDULER
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def template(cpu: str) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "w"}},
        "spec": {"containers": [
            {"name": "a", "image": IMAGE, "resources": {"requests": {"cpu": cpu}}}]},
    }  # fmt: skip


async def rq_status(team: Team, namespace: str, name: str) -> dict[str, dict[str, str]]:
    quota = await team.core.read_namespaced_resource_quota(name, namespace)
    status = quota.status
    return {"hard": dict(status.hard or {}), "used": dict(status.used or {})} if status else {}


async def wait_rq_used(team: Team, namespace: str, name: str, used: Mapping[str, str]) -> None:
    want = dict(used)
    await eventually(
        lambda: rq_status(team, namespace, name),
        until=lambda s: s.get("used") == want,
        within=WITHIN_S,
        what=f"ResourceQuota {namespace}/{name} used {want}",
    )


def resources_of(entry: Mapping[str, Any]) -> dict[str, tuple[str | None, str]]:
    """A status JSON quota entry's resources as {name: (used, hard)}."""
    return {r["name"]: (r["used"], r["hard"]) for r in entry["resources"]}


def find(quotas: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [q for q in quotas if q["kind"] == kind and q["name"] == name]
    assert 1 == len(matches), f"{kind} {name} in {quotas}"
    return matches[0]


async def test_status_shows_what_the_controller_wrote(
    team: Team, control_plane: ControlPlane
) -> None:
    # ns1: pods of 100m and 250m; ns2: one of 300m. The ResourceQuota in ns1 holds 2 pods and
    # 350m; the ClusterQuota over both, 3 pods and 650m, 350m of it ns1's.
    ns1, ns2 = await team.member_namespaces(2)
    await team.resource_quota(ns1, "rq", {"pods": "5", "requests.cpu": "1"})
    cq = await team.cluster_quota({"pods": "8", "requests.cpu": "2"})
    await team.pod(ns1, "a", "100m")
    await team.pod(ns1, "b", "250m")
    await team.pod(ns2, "c", "300m")
    await wait_rq_used(team, ns1, "rq", {"pods": "2", "requests.cpu": "350m"})
    cq_status = await wait_for_status(
        team,
        cq,
        {"pods": "3", "requests.cpu": "650m"},
        {ns1: {"pods": "2", "requests.cpu": "350m"}, ns2: {"pods": "1", "requests.cpu": "300m"}},
    )
    rq_written = await rq_status(team, ns1, "rq")

    run = await kubectl_tally(control_plane.kubeconfig, "status", "-n", ns1, "-o", "json")
    assert (0, "") == (run.code, run.err)
    data = run.json()
    assert [ns1] == data["namespaces"]
    assert [("ResourceQuota", "rq"), ("ClusterQuota", cq)] == [
        (q["kind"], q["name"]) for q in data["quotas"]
    ]
    rq_entry = find(data["quotas"], "ResourceQuota", "rq")
    assert {
        name: (rq_written["used"][name], rq_written["hard"][name]) for name in rq_written["hard"]
    } == resources_of(rq_entry)
    # The headroom and percentage of the controller's figures: pods 5 - 2, 2 of 5.
    pods = next(r for r in rq_entry["resources"] if r["name"] == "pods")
    assert ("3", 40.0) == (pods["headroom"], pods["percent"])
    cq_entry = find(data["quotas"], "ClusterQuota", cq)
    total = cq_status["total"]
    assert {name: (total["used"][name], total["hard"][name]) for name in total["hard"]} == (
        resources_of(cq_entry)
    )
    share = next(e for e in cq_status["namespaces"] if e["namespace"] == ns1)
    assert [{"namespace": ns1, "used": share["status"]["used"]}] == cq_entry["namespaces"]
    assert cq_status["namespaceCount"] == cq_entry["namespaceCount"]

    # YAML says the same; text piped is plain, coloured on request.
    as_yaml = await kubectl_tally(control_plane.kubeconfig, "status", "-n", ns1, "-o", "yaml")
    assert data == yaml.safe_load(as_yaml.out)
    text = await kubectl_tally(control_plane.kubeconfig, "status", "-n", ns1)
    assert 0 == text.code
    assert "\x1b[" not in text.out
    assert f"ResourceQuota {ns1}/rq" in text.out
    assert "  pods          2     5     [########............]   40%  3\n" in text.out
    coloured = await kubectl_tally(control_plane.kubeconfig, "status", "-n", ns1, "--color=always")
    assert "\x1b[32m" in coloured.out

    # -A: every namespace; the ClusterQuota once, with both namespaces' shares.
    everything = await kubectl_tally(control_plane.kubeconfig, "status", "-A", "-o", "json")
    assert 0 == everything.code, everything.err
    all_quotas = everything.json()["quotas"]
    rqs = [q for q in all_quotas if q["kind"] == "ResourceQuota" and q.get("namespace") == ns1]
    assert ["rq"] == [q["name"] for q in rqs]
    assert {
        ns1: {"pods": "2", "requests.cpu": "350m"},
        ns2: {"pods": "1", "requests.cpu": "300m"},
    } == {s["namespace"]: s["used"] for s in find(all_quotas, "ClusterQuota", cq)["namespaces"]}


async def test_kubectl_finds_the_plugin_on_path(team: Team, control_plane: ControlPlane) -> None:
    assert KUBECTL_TALLY.is_file(), "pip install puts the console script beside python"
    namespace = await team.namespace()
    await team.resource_quota(namespace, "rq", {"pods": "4"})
    await wait_rq_used(team, namespace, "rq", {"pods": "0"})
    kubectl = str(control_plane.bin_dir / "kubectl")
    path = f"{KUBECTL_TALLY.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    via = ["env", f"PATH={path}", kubectl, "tally"]
    run = await kubectl_tally(control_plane.kubeconfig, "status", "-n", namespace, "-o", "json",
                              via=via)  # fmt: skip
    assert (0, "") == (run.code, run.err)
    assert {"pods": ("0", "4")} == resources_of(find(run.json()["quotas"], "ResourceQuota", "rq"))
    helped = await kubectl_tally(control_plane.kubeconfig, "--help", via=via)
    assert 0 == helped.code
    assert "kubectl tally top -n team-a" in helped.out


async def test_top_orders_by_the_evaluators_figures(
    team: Team, control_plane: ControlPlane, api: client.ApiClient
) -> None:
    # By hand, with upstream's pod formula: big 150m + 250m = 400m; init needs the larger of
    # its init container (300m) and its container (100m) = 300m; the ReplicaSet's pod 200m;
    # the PodSet's two pods 120m each; small 50m; idle (no requests) and done (Succeeded)
    # use none. Total 1190m, over 6 objects.
    namespace = await team.namespace()
    # Scoped to NotBestEffort: a quota on requests.cpu refuses pods without a cpu request
    # unless they are out of its scope, as the BestEffort pod idle is.
    await team.core.create_namespaced_resource_quota(
        namespace,
        {"metadata": {"name": "rq"},
         "spec": {"hard": {"requests.cpu": "10"}, "scopes": ["NotBestEffort"]}},
    )  # fmt: skip
    for body in (
        pod_body("big", "150m", "250m"),
        pod_body("init", "100m", init_cpu="300m"),
        pod_body("small", "50m"),
        pod_body("done", "500m", played=True),
        pod_body("idle", None),
    ):
        await team.core.create_namespaced_pod(namespace, body)
    await set_pod_status(api, namespace, "done", phase="Succeeded", ready=False)
    await team.custom.create_namespaced_custom_object(
        "tally.dev", "v1alpha1", namespace, "podsets",
        {"apiVersion": "tally.dev/v1alpha1", "kind": "PodSet", "metadata": {"name": "web"},
         "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "w"}},
                  "template": template("120m")}},
    )  # fmt: skip
    await client.AppsV1Api(api).create_namespaced_replica_set(
        namespace,
        {"metadata": {"name": "rs"},
         "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "r"}},
                  "template": {**template("200m"), "metadata": {"labels": {"app": "r"}}}}},
    )  # fmt: skip

    async def pod_count() -> int:
        return len((await team.core.list_namespaced_pod(namespace)).items)

    await eventually(pod_count, until=lambda n: n == 8, within=WITHIN_S, what="8 pods")
    await wait_rq_used(team, namespace, "rq", {"requests.cpu": "1190m"})

    run = await kubectl_tally(control_plane.kubeconfig, "top", "-n", namespace, "--limit", "3",
                              "-o", "json")  # fmt: skip
    assert (0, "") == (run.code, run.err)
    data = run.json()
    top = [(t["kind"], t["name"], t["usage"], t["owner"]) for t in data["top"]]
    assert [("Pod", "big", "400m", None), ("Pod", "init", "300m", None)] == top[:2]
    kind, name, usage, owner = top[2]
    assert ("Pod", "200m", {"kind": "ReplicaSet", "name": "rs"}) == (kind, usage, owner)
    assert name.startswith("rs-")
    # What every object uses adds up to what the quota controller charged.
    assert "1190m" == data["total"]
    assert (6, 8) == (data["objectsUsing"], data["objectsMeasured"])

    every = (await kubectl_tally(control_plane.kubeconfig, "top", "-n", namespace, "--limit", "0",
                                 "-o", "json")).json()["top"]  # fmt: skip
    podset_pods = [t for t in every if t["owner"] == {"kind": "PodSet", "name": "web"}]
    assert ["120m", "120m"] == [t["usage"] for t in podset_pods]
    assert "small" == every[-1]["name"]

    # A PodSet measure: the template's 120m times 2 replicas.
    measured = await kubectl_tally(
        control_plane.kubeconfig, "top", "-n", namespace,
        "--resource", "podsets.tally.dev/requests.cpu", "-o", "json",
    )  # fmt: skip
    assert [("PodSet", "web", "240m")] == [
        (t["kind"], t["name"], t["usage"]) for t in measured.json()["top"]
    ]
    text = await kubectl_tally(control_plane.kubeconfig, "top", "-n", namespace, "--limit", "1")
    assert (
        f"requests.cpu in {namespace}: 1190m over 6 objects, the top 1\n"
        "  KIND  NAME  OWNER  REQUESTS.CPU  SHARE\n"
        "  Pod   big   -      400m           33%\n"
    ) == text.out


async def test_why_agrees_with_the_api_server(team: Team, control_plane: ControlPlane) -> None:
    # The namespace runs one pod of 300m. The ResourceQuota allows 2 pods and 1 cpu; the
    # ClusterQuota 600m cpu. 200m fits both; 400m takes the ClusterQuota to 700m, 100m over;
    # once the 200m pod runs, a third pod (100m) is one pod over the ResourceQuota.
    namespace = await team.namespace()
    await team.resource_quota(namespace, "rq", {"pods": "2", "requests.cpu": "1"})
    cq = await team.cluster_quota({"requests.cpu": "600m"})
    await team.pod(namespace, "first", "300m")
    await wait_rq_used(team, namespace, "rq", {"pods": "1", "requests.cpu": "300m"})
    await wait_for_status(team, cq, {"requests.cpu": "300m"},
                          {namespace: {"requests.cpu": "300m"}})  # fmt: skip
    manifests = {
        name: yaml.safe_dump(pod_body(name, cpu))
        for name, cpu in (("fits", "200m"), ("too-big", "400m"), ("third", "100m"))
    }

    async def why(name: str) -> Run:
        return await kubectl_tally(control_plane.kubeconfig, "why", "-f", "-", "-n", namespace,
                                   "-o", "json", stdin=manifests[name])  # fmt: skip

    async def create(name: str) -> str | None:
        """Create the pod for real: None if admitted, else the refusal's message."""
        try:
            await team.core.create_namespaced_pod(namespace, yaml.safe_load(manifests[name]))
        except client.ApiException as error:
            if error.status != 403:
                raise
            return str(json.loads(error.body)["message"])
        return None

    fits = await why("fits")
    assert (0, "") == (fits.code, fits.err)
    explained = fits.json()
    assert {"allowed": True} == explained["server"]
    assert {"count/pods": "1", "cpu": "200m", "pods": "1", "requests.cpu": "200m"} == (
        explained["usage"]
    )
    charges = {
        (q["kind"], q["name"]): {c["name"]: (c["used"], c["requested"], c["hard"])
                                 for c in q["charges"]}
        for q in explained["quotas"]
    }  # fmt: skip
    # used and hard are the controller's figures, read above.
    assert {
        ("ResourceQuota", "rq"): {"pods": ("1", "1", "2"), "requests.cpu": ("300m", "200m", "1")},
        ("ClusterQuota", cq): {"requests.cpu": ("300m", "200m", "600m")},
    } == charges
    # A dry run charges nothing.
    assert {"pods": "1", "requests.cpu": "300m"} == (await rq_status(team, namespace, "rq"))["used"]

    too_big = await why("too-big")
    assert (1, "") == (too_big.code, too_big.err)
    server = too_big.json()["server"]
    assert {"kind": "ClusterQuota", "name": cq, "reason": "exceeded"} == server["quota"]
    assert {"requests.cpu": "100m"} == server["overBy"]
    # The API server's real decision is the same, in the same words.
    assert server["message"] == await create("too-big")
    assert await create("fits") is None
    await wait_rq_used(team, namespace, "rq", {"pods": "2", "requests.cpu": "500m"})

    third = await why("third")
    assert (1, "") == (third.code, third.err)
    server = third.json()["server"]
    assert {"kind": "ResourceQuota", "name": "rq", "reason": "exceeded"} == server["quota"]
    assert {"pods": "1"} == server["overBy"]
    assert server["message"] == await create("third")

    text = await kubectl_tally(control_plane.kubeconfig, "why", "-f", "-", "-n", namespace,
                               stdin=manifests["third"])  # fmt: skip
    assert 1 == text.code
    assert "Server (dry run): refused by ResourceQuota rq\n" in text.out
    assert "  over by pods=1 (used 2 + requested 1 > limited 2)\n" in text.out


async def test_a_namespace_reader_gets_one_line_errors(
    team: Team, control_plane: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> None:
    namespace = await team.namespace()
    await team.resource_quota(namespace, "rq", {"pods": "3"})
    cq = await team.cluster_quota({"pods": "6"})
    await wait_rq_used(team, namespace, "rq", {"pods": "0"})
    account = "reader"
    await team.core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    rbac = client.RbacAuthorizationV1Api(api)
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    # The built-in "view" role, in this namespace only: reads, no writes, nothing cluster-wide.
    await rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "reader-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "view"},
        "subjects": [subject]})  # fmt: skip
    kubeconfig = token_kubeconfig(control_plane, namespace, account, tmp_path / "reader")
    user = f'User "system:serviceaccount:{namespace}:{account}"'

    # The ClusterQuota through the namespace's AppliedClusterQuota (which the view role reads
    # and tally writes a moment after the ClusterQuota's first status): nothing is missing.
    async def viewed() -> Run:
        return await kubectl_tally(kubeconfig, "status", "-o", "json")

    status = await eventually(
        viewed,
        until=lambda r: r.code == 0 and len(r.json()["quotas"]) == 2,
        within=WITHIN_S,
        what="the reader's status with the applied ClusterQuota",
    )
    assert "" == status.err
    assert [("ResourceQuota", "rq"), ("ClusterQuota", cq)] == [
        (q["kind"], q["name"]) for q in status.json()["quotas"]
    ]

    # A user who may read neither the ClusterQuotas nor the applied view (a Role of its own:
    # the namespace and its ResourceQuotas): what it may read it sees; what it may not, one
    # line each; exit 2.
    narrow = "narrow"
    await team.core.create_namespaced_service_account(namespace, {"metadata": {"name": narrow}})
    await rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": narrow},
            "rules": [
                {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
                {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["list"]},
            ],
        },
    )
    await rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": narrow},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": narrow},
        "subjects": [{"kind": "ServiceAccount", "name": narrow,
                      "namespace": namespace}]})  # fmt: skip
    narrow_kubeconfig = token_kubeconfig(control_plane, namespace, narrow, tmp_path / narrow)
    narrow_user = f'User "system:serviceaccount:{namespace}:{narrow}"'
    status = await kubectl_tally(narrow_kubeconfig, "status", "-o", "json")
    assert 2 == status.code
    assert [("ResourceQuota", "rq")] == [(q["kind"], q["name"]) for q in status.json()["quotas"]]
    assert [
        f"error: forbidden: {narrow_user} may not list clusterquotas.tally.dev at the cluster "
        "scope (the ClusterRole tally-clusterquota-viewer grants it)"
    ] == status.err.splitlines()

    everywhere = await kubectl_tally(kubeconfig, "status", "-A")
    assert (2, "") == (everywhere.code, everywhere.out)
    assert [
        f"error: forbidden: {user} may not list namespaces",
        f"error: forbidden: {user} may not list resourcequotas at the cluster scope",
    ] == everywhere.err.splitlines()

    elsewhere = await kubectl_tally(kubeconfig, "top", "-n", "default")
    assert (2, "") == (elsewhere.code, elsewhere.out)
    assert [f'error: forbidden: {user} may not list pods in namespace "default"'] == (
        elsewhere.err.splitlines()
    )

    why = await kubectl_tally(kubeconfig, "why", "-f", "-", stdin=json.dumps(pod_body("p", "1m")))
    assert (2, "") == (why.code, why.out)
    assert [f'error: forbidden: {user} may not create pods in namespace "{namespace}"'] == (
        why.err.splitlines()
    )

    # Given the right to read ClusterQuotas (as tally-clusterquota-viewer grants), the same
    # reader sees the ClusterQuota too, and nothing is missing.
    role = f"e2e-cq-viewer-{uuid.uuid4().hex[:8]}"
    await rbac.create_cluster_role({
        "metadata": {"name": role},
        "rules": [{"apiGroups": ["tally.dev"], "resources": ["clusterquotas"],
                   "verbs": ["get", "list", "watch"]}]})  # fmt: skip
    try:
        await rbac.create_cluster_role_binding({
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": role},
            "subjects": [subject]})  # fmt: skip

        async def status_now() -> Run:
            return await kubectl_tally(kubeconfig, "status", "-o", "json")

        allowed = await eventually(
            status_now,
            until=lambda r: r.code == 0,
            within=WITHIN_S,
            what="the reader's status once it may read ClusterQuotas",
        )
        assert "" == allowed.err
        assert [("ResourceQuota", "rq"), ("ClusterQuota", cq)] == [
            (q["kind"], q["name"]) for q in allowed.json()["quotas"]
        ]
    finally:
        with contextlib.suppress(client.ApiException):
            await rbac.delete_cluster_role_binding(role)
        with contextlib.suppress(client.ApiException):
            await rbac.delete_cluster_role(role)


async def test_errors_are_one_line(team: Team, control_plane: ControlPlane, tmp_path: Path) -> None:
    unknown = f"e2e-missing-{uuid.uuid4().hex[:8]}"
    for args in (("status", "-n", unknown), ("top", "-n", unknown)):
        run = await kubectl_tally(control_plane.kubeconfig, *args)
        assert (2, "", [f'error: namespace "{unknown}" not found']) == (
            run.code, run.out, run.err.splitlines()
        )  # fmt: skip

    # A kubeconfig naming a port nothing listens on: no cluster.
    admin = yaml.safe_load(control_plane.kubeconfig.read_text())
    port = cluster.free_port()
    admin["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    dead = tmp_path / "dead"
    dead.write_text(json.dumps(admin))
    run = await kubectl_tally(dead, "status")
    assert (2, "") == (run.code, run.out)
    (line,) = run.err.splitlines()
    assert line.startswith(f"error: cannot reach the API server at https://127.0.0.1:{port}: ")

    namespace = await team.namespace()
    run = await kubectl_tally(control_plane.kubeconfig, "top", "-n", namespace, "--resource", "x")
    assert (2, "") == (run.code, run.out)
    assert run.err.startswith('error: no evaluator measures "x": ')
    widget = "apiVersion: v1\nkind: Widget\nmetadata: {name: w}\n"
    run = await kubectl_tally(control_plane.kubeconfig, "why", "-f", "-", stdin=widget)
    assert (2, ['error: the server does not serve kind "Widget" in "v1"']) == (
        run.code, run.err.splitlines()
    )  # fmt: skip
