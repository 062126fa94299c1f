"""AppliedClusterQuotas: what each team's own users read of the ClusterQuotas binding them.

Two teams of two namespaces each; one ClusterQuota per team and one shared by both. Each team
has a service account holding nothing but the built-in ``view`` role, by RoleBindings in its
own two namespaces, and reads with its own token through kubectl, as a team member would.
Expected values are worked out by hand from the pods each test creates; "nothing of the other
team" is checked as no string naming the other team's namespaces or ClusterQuota in anything
the user can read in its namespaces (the applied objects as YAML, the namespaces' Events).

Bounds: :data:`FOLLOW_WITHIN_S` for the view to follow a change (a ClusterQuota's status takes
up to a few seconds to follow pods; the view then waits at most
``TALLY_APPLIED_QUOTA_INTERVAL``, 1 s, to be written).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml
from clusterquota_e2e import APPLIED_PLURAL, GROUP, VERSION, Team
from kubernetes_asyncio import client

from tally_e2e import ControlPlane, eventually, token_kubeconfig

# The fixtures `cq_crd` and `team`.
pytest_plugins = ["clusterquota_e2e"]

KUBECTL_TALLY: Final = Path(sys.executable).parent / "kubectl-tally"
POD: Final = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "would-it-fit"},
    "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
}

FOLLOW_WITHIN_S: Final = 15.0
CHARGE_SEEN_WITHIN_S: Final = 5.0
"""From a create's answer to a ``kubectl get -w`` of the applied object showing it."""


async def label(api: client.ApiClient, namespace: str, labels: Mapping[str, str | None]) -> None:
    patch: Any = client.CoreV1Api(api).patch_namespace
    await patch(namespace, {"metadata": {"labels": dict(labels)}})


async def reader(
    api: client.ApiClient, plane: ControlPlane, namespaces: list[str], directory: Path
) -> Path:
    """A service account of ``namespaces[0]`` with the built-in ``view`` role in each of
    ``namespaces`` (RoleBindings), and a kubeconfig with its token."""
    home = namespaces[0]
    await client.CoreV1Api(api).create_namespaced_service_account(
        home, {"metadata": {"name": "reader"}}
    )
    rbac = client.RbacAuthorizationV1Api(api)
    for namespace in namespaces:
        await rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "reader-view"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": home}],
        })  # fmt: skip
    return token_kubeconfig(plane, home, "reader", directory / f"reader-{home}")


def kubectl_as(
    plane: ControlPlane, kubeconfig: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(plane.bin_dir / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def tally_as(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``kubectl tally`` as the user, a pod manifest on stdin (for ``why -f -``)."""
    return subprocess.run(
        [str(KUBECTL_TALLY), *args], input=json.dumps(POD),
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def applied_as(plane: ControlPlane, kubeconfig: Path, namespace: str) -> dict[str, Any]:
    """The applied objects of ``namespace`` as the user lists them: name -> (total used pods,
    this namespace's pods, remaining pods, hard pods)."""
    listed = kubectl_as(plane, kubeconfig, "get", "appliedclusterquotas", "-n", namespace,
                        "-o", "json")  # fmt: skip
    assert 0 == listed.returncode, listed.stderr
    shown = {}
    for item in json.loads(listed.stdout)["items"]:
        status = item.get("status") or {}
        shown[item["metadata"]["name"]] = (
            (status.get("total") or {}).get("used", {}).get("pods"),
            (status.get("namespace") or {}).get("used", {}).get("pods"),
            (status.get("remaining") or {}).get("pods"),
            (status.get("total") or {}).get("hard", {}).get("pods"),
        )
    return shown


async def test_each_team_reads_its_limits_and_nothing_of_the_other(
    team: Team, control_plane: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> None:
    a1, a2, b1, b2 = await team.member_namespaces(4)
    side_a, side_b = f"a-{team.id}", f"b-{team.id}"
    for namespace, side in ((a1, side_a), (a2, side_a), (b1, side_b), (b2, side_b)):
        await label(api, namespace, {"side": side})
    cq_a = await team.cluster_quota(
        {"pods": "10"}, namespaceSelector={"matchLabels": {"side": side_a}}
    )
    cq_b = await team.cluster_quota(
        {"pods": "10"}, namespaceSelector={"matchLabels": {"side": side_b}}
    )
    shared = await team.cluster_quota({"pods": "20"})  # every namespace of the team
    user_a = await reader(api, control_plane, [a1, a2], tmp_path)
    user_b = await reader(api, control_plane, [b1, b2], tmp_path)
    for namespace, pods in ((a1, 2), (a2, 1), (b1, 3)):
        for index in range(pods):
            await team.pod(namespace, f"p{index}", cpu="10m")

    # By hand: team a has 2 + 1 pods, team b 3; the shared quota sees all 6.
    expected = {
        (user_a, a1): {cq_a: ("3", "2", "7", "10"), shared: ("6", "2", "14", "20")},
        (user_a, a2): {cq_a: ("3", "1", "7", "10"), shared: ("6", "1", "14", "20")},
        (user_b, b1): {cq_b: ("3", "3", "7", "10"), shared: ("6", "3", "14", "20")},
        (user_b, b2): {cq_b: ("3", "0", "7", "10"), shared: ("6", "0", "14", "20")},
    }
    for (user, namespace), views in expected.items():
        await eventually(
            lambda user=user, namespace=namespace: asyncio.to_thread(
                applied_as, control_plane, user, namespace
            ),
            until=lambda shown, views=views: shown == views,
            within=FOLLOW_WITHIN_S,
            what=f"the applied ClusterQuotas of {namespace}",
        )

    # The table, as `kubectl get` prints it: each column one line of text, never a map.
    table = kubectl_as(control_plane, user_a, "get", "appliedclusterquotas", "-n", a1,
                       "-o", "wide")  # fmt: skip
    assert 0 == table.returncode, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split() == ["NAME", "MOST", "USED", "HERE", "REMAINING", "AGE"]
    row = next(line for line in rows if line.startswith(shared + " "))
    # Most used pods 6/20; a1's own 2; 20 - 6 remain.
    assert [shared, "pods 6/20", "pods: 2", "pods: 14"] == re.split(r"\s{2,}", row)[:4], row
    assert "{" not in table.stdout, table.stdout

    # Nothing of the other team in anything the user reads in its namespaces.
    for user, own, other in (
        (user_a, (a1, a2), (b1, b2, cq_b)),
        (user_b, (b1, b2), (a1, a2, cq_a)),
    ):
        for namespace in own:
            for kind in ("appliedclusterquotas", "events"):
                read = kubectl_as(control_plane, user, "get", kind, "-n", namespace, "-o", "yaml")
                assert 0 == read.returncode, read.stderr
                for secret in other:
                    # A whole name: the team's ClusterQuota names are the tails of its
                    # namespace names (cq-<id>-1, e2e-cq-<id>-1).
                    whole = rf"(?<![\w.-]){re.escape(secret)}(?![\w.-])"
                    assert re.search(whole, read.stdout) is None, (namespace, kind, secret)
            # kubectl tally, as the user: every ClusterQuota binding the namespace, from the
            # applied view (exit 0), and nothing of the other team, in status or why.
            for args in (("status", "-n", namespace, "-o", "yaml"),
                         ("why", "-n", namespace, "-f", "-")):  # fmt: skip
                shown = tally_as(user, *args)
                for secret in other:
                    whole = rf"(?<![\w.-]){re.escape(secret)}(?![\w.-])"
                    assert re.search(whole, shown.stdout + shown.stderr) is None, (args, secret)
                if args[0] == "status":
                    assert (0, "") == (shown.returncode, shown.stderr)
                    quotas = yaml.safe_load(shown.stdout)["quotas"]
                    assert {q["name"] for q in quotas} == set(expected[(user, namespace)])
        # Nor may it read the other team's namespaces, nor write the view.
        refused = kubectl_as(control_plane, user, "get", "appliedclusterquotas", "-n", other[0])
        assert 1 == refused.returncode
        assert "Forbidden" in refused.stderr, refused.stderr
        for args in (("delete", "appliedclusterquota", shared, "-n", own[0]),
                     ("patch", "appliedclusterquota", shared, "-n", own[0], "--type=merge",
                      "-p", '{"status":{"remaining":{"pods":"1000"}}}')):  # fmt: skip
            write = kubectl_as(control_plane, user, *args)
            assert 1 == write.returncode, write.stdout
            assert "Forbidden" in write.stderr, write.stderr


async def test_the_view_follows_labels_limits_deletions_and_a_watch_sees_a_charge(
    team: Team, control_plane: ControlPlane, api: client.ApiClient, tmp_path: Path
) -> None:
    a1, a2, b1 = await team.member_namespaces(3)
    cq = await team.cluster_quota({"pods": "10"})
    user = await reader(api, control_plane, [a1, a2], tmp_path)
    await team.pod(a1, "p0", cpu="10m")
    await team.pod(a2, "p0", cpu="10m")

    async def seen(namespace: str, views: dict[str, Any], what: str) -> None:
        await eventually(
            lambda: asyncio.to_thread(applied_as, control_plane, user, namespace),
            until=lambda shown: shown == views, within=FOLLOW_WITHIN_S, what=what,
        )  # fmt: skip

    await seen(a1, {cq: ("2", "1", "8", "10")}, "a1's view")

    # A watch as the user sees the next charge in a1 within the bound.
    watch = await asyncio.create_subprocess_exec(
        str(control_plane.bin_dir / "kubectl"), f"--kubeconfig={user}", "get",
        "appliedclusterquota", cq, "-n", a1, "-w",
        "-o", "jsonpath={.status.namespace.used.pods}{'\\n'}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert watch.stdout is not None
        first = await asyncio.wait_for(watch.stdout.readline(), timeout=30)
        assert b"1\n" == first
        await team.pod(a1, "p1", cpu="10m")
        answered = time.monotonic()
        while True:
            line = await asyncio.wait_for(watch.stdout.readline(), timeout=CHARGE_SEEN_WITHIN_S)
            if line == b"2\n":
                break
        assert time.monotonic() - answered <= CHARGE_SEEN_WITHIN_S
    finally:
        with contextlib.suppress(ProcessLookupError):
            watch.kill()
        await watch.wait()

    # The limit changed: every view shows it.
    await team.merge_patch(cq, {"spec": {"quota": {"hard": {"pods": "5"}}}})
    await seen(a1, {cq: ("3", "2", "2", "5")}, "a1's view of the new limit")

    # a2 leaves the ClusterQuota: its view goes, and a1's total drops by a2's pod.
    await label(api, a2, {"team": None})
    await seen(a2, {}, "a2's view gone")
    await seen(a1, {cq: ("2", "2", "3", "5")}, "a1's total without a2")
    # ... and comes back.
    await label(api, a2, {"team": team.id})
    await seen(a2, {cq: ("3", "1", "2", "5")}, "a2's view back")

    custom = client.CustomObjectsApi(api)

    # A namespace deleted leaves nothing of the view behind.
    async def holding() -> set[str]:
        listed = await custom.list_cluster_custom_object(GROUP, VERSION, APPLIED_PLURAL)
        return {i["metadata"]["namespace"] for i in listed["items"] if i["metadata"]["name"] == cq}

    assert {a1, a2, b1} == await eventually(holding, until=lambda held: len(held) == 3,
                                            within=FOLLOW_WITHIN_S, what="three views")  # fmt: skip
    await client.CoreV1Api(api).delete_namespace(b1)
    await eventually(holding, until=lambda held: held == {a1, a2}, within=60,
                     what="the deleted namespace's view gone")  # fmt: skip

    # The ClusterQuota deleted: no view is left anywhere.
    await custom.delete_cluster_custom_object(GROUP, VERSION, "clusterquotas", cq)
    for namespace in (a1, a2):

        async def left(namespace: str = namespace) -> list[str]:
            listed = await custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace, APPLIED_PLURAL
            )
            return [item["metadata"]["name"] for item in listed["items"]]

        await eventually(left, until=lambda names: names == [], within=FOLLOW_WITHIN_S,
                         what=f"no applied ClusterQuota left in {namespace}")  # fmt: skip


async def test_a_view_changed_by_hand_is_restored(team: Team, api: client.ApiClient) -> None:
    (a1,) = await team.member_namespaces(1)
    cq = await team.cluster_quota({"pods": "4"})
    custom = client.CustomObjectsApi(api)

    async def remaining() -> str | None:
        with contextlib.suppress(client.ApiException):
            obj = await custom.get_namespaced_custom_object(GROUP, VERSION, a1, APPLIED_PLURAL, cq)
            return str(((obj.get("status") or {}).get("remaining") or {}).get("pods"))
        return None

    await eventually(remaining, until=lambda left: left == "4", within=FOLLOW_WITHIN_S,
                     what="the first view")  # fmt: skip
    patch: Any = custom.patch_namespaced_custom_object
    await patch(GROUP, VERSION, a1, APPLIED_PLURAL, cq,
                {"status": {"remaining": {"pods": "1000"}}},
                _content_type="application/merge-patch+json")  # fmt: skip
    await eventually(remaining, until=lambda left: left == "4", within=FOLLOW_WITHIN_S,
                     what="the view restored after an edit")  # fmt: skip
    await custom.delete_namespaced_custom_object(GROUP, VERSION, a1, APPLIED_PLURAL, cq)
    await eventually(remaining, until=lambda left: left == "4", within=FOLLOW_WITHIN_S,
                     what="the view restored after a deletion")  # fmt: skip
