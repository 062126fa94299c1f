"""tally never refuses what upstream admits: one corpus of ordinary and awkward requests, run on
three clusters, the same answers wherever no quota decides.

The corpus (:func:`corpus`, 50 requests) is what a platform's users, Helm and kubelets send,
and what breaks servers that were only tried with small friendly objects: ConfigMaps and
Secrets of 100 KiB, 600 KiB and just under 1 MiB, created, updated (an UPDATE review carries the
object twice), patched (JSON, merge and strategic merge patches), applied server-side (with a
conflict, then forced), dry-run; one just over the 1 MiB limit; a Secret shaped like a Helm
release (``helm.sh/release.v1``, ~700 KiB) and the label update Helm makes when it supersedes
one; custom resources nested 2 000 and 9 000 levels deep (the API server stores up to 10 000)
and one carrying a 5 000-digit integer (which the API server refuses); PodSets whose template
is nested as deep; a pod with 50 containers, a kubelet's status write, an update that moves it
to the Terminating scope; services, PVCs, quotas; status writes; deletes with preconditions
that hold and that fail.

It runs, each time in a fresh namespace:

* on the **reference** plane alone (upstream's quota system, no tally): the oracle;
* on the **operator** plane with tally (the module's ``operator``: tally under its
  ServiceAccount's RBAC, enforcing ResourceQuotas), and a ClusterQuota over the namespace;
* on the **reference** plane with tally started beside upstream (enforcing ClusterQuotas only,
  as on a managed cluster), and a ClusterQuota over the namespace.

Each namespace has a ResourceQuota (and the tally sides a ClusterQuota) naming every kind the
corpus creates, generous enough never to decide: so tally judges, and charges, every create and
every update it is asked about. The ClusterQuotas also hold a measure over the custom resources
(an UPDATE of one is judged too) and a PodSet measure (so are PodSet updates and scales).

What must hold: the three lists of (request, HTTP code, message) are equal, messages compared
with the namespace, uids and resourceVersions masked; afterwards every quota's usage equals
upstream's for the same namespace contents (nothing charged for a refused request, nothing
left charged), the ClusterQuotas' totals too; and tally's logs hold no traceback.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import json
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
from kubernetes_asyncio import client
from operator_process import TallyProcess
from raw_api import RawApi

import builders
from tally.quota.quantity import parse_quantity
from tally_e2e import (
    ControlPlane,
    RunningOperator,
    eventually,
    wait_for_default_service_account,
    wait_for_root_ca_configmap,
)

REPO: Final = Path(__file__).resolve().parents[2]
CRDS: Final = REPO / "crds"
JSON: Final = "application/json"
MERGE: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
STRATEGIC: Final = "application/strategic-merge-patch+json"
APPLY: Final = "application/apply-patch+yaml"
KIB: Final = 1024
MIB: Final = 1024 * KIB
IMAGE: Final = "registry.example/app:1"
START_BOUND_S: Final = 60.0
SETTLE_WITHIN_S: Final = 60.0

GROUP, VERSION, PLURAL = "e2e.tally.dev", "v1", "blobs"
CRD: Final = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "names": {"kind": "Blob", "plural": PLURAL, "singular": "blob"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}
MEASURE: Final = "example.com/blob-size"
# Never deciding: far above what the corpus creates.
QUOTA_HARD: Final = {
    "pods": "100",
    "requests.cpu": "100",
    "requests.memory": "100Gi",
    "services": "100",
    "persistentvolumeclaims": "100",
    "requests.storage": "1Ti",
    "count/configmaps": "100",
    "count/secrets": "100",
    f"count/{PLURAL}.{GROUP}": "100",
    "count/podsets.tally.dev": "100",
}
CLUSTER_QUOTA_HARD: Final = {
    **QUOTA_HARD,
    MEASURE: "1000",
    "podsets.tally.dev/requests.cpu": "1000",
}
UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
VERSION_IN: Final = re.compile(
    r"(ResourceVersion in (?:the )?(?:precondition|record|object meta))(:? \(?)\d+"
)


# -- the corpus -------------------------------------------------------------------------------


@dataclass
class Ctx:
    """What a request may need when it is sent: the namespace, and the API to read from."""

    namespace: str
    api: RawApi

    async def uid(self, path: str) -> str:
        return str((await self._metadata(path)).get("uid", ""))

    async def version(self, path: str) -> str:
        return str((await self._metadata(path)).get("resourceVersion", ""))

    async def _metadata(self, path: str) -> Mapping[str, Any]:
        """The object's metadata; none when it is missing (an earlier request of the corpus
        failed here: the request that needed it then fails too, and the report shows both)."""
        try:
            return await self.api.metadata(self.path(path))
        except aiohttp.ClientResponseError:
            return {}

    def path(self, path: str) -> str:
        return path.format(ns=self.namespace)


Body = bytes | str | None | Callable[[Ctx], Awaitable[bytes | str | None]]


@dataclass(frozen=True)
class Request:
    name: str
    method: str
    path: str
    """``{ns}`` stands for the namespace."""
    body: Body = None
    content_type: str = JSON
    query: tuple[tuple[str, str], ...] = ()
    retry_conflicts: bool = False
    """Read the resourceVersion again and retry on a 409 "the object has been modified": the
    object's controller (tally's PodSet controller, where tally runs) may write its status
    between the read and the write, as any client of a controlled object meets."""


@dataclass(frozen=True)
class Outcome:
    name: str
    status: int
    message: str


def core(resource: str, name: str = "", sub: str = "") -> str:
    path = f"/api/v1/namespaces/{{ns}}/{resource}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def blobs(name: str = "", sub: str = "") -> str:
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{PLURAL}"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def podsets(name: str = "", sub: str = "") -> str:
    path = "/apis/tally.dev/v1alpha1/namespaces/{ns}/podsets"
    return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


def text(size: int, seed: int) -> str:
    """``size`` printable characters, different per seed (nothing compresses them away)."""
    rng = random.Random(seed)
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=size))


def blob_bytes(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def config_map(name: str, size: int, seed: int = 0) -> str:
    data = {"payload": text(size, seed)}
    return json.dumps(builders.config_map(name, data=data, with_kind=True))


def secret(name: str, size: int, seed: int = 0) -> str:
    data = {"payload": b64(blob_bytes(size, seed))}
    return json.dumps(builders.secret(name, data=data, with_kind=True))


def helm_release(status: str) -> str:
    """A release as Helm 3 stores it: a Secret of type ``helm.sh/release.v1`` whose
    ``release`` is the release JSON, gzipped and base64-encoded (and base64 again as Secret
    data), labelled with the release's name, owner, status and version."""
    release = {
        "name": "web",
        "version": 1,
        "namespace": "ns",
        "info": {"status": status, "description": "Install complete"},
        "chart": {"metadata": {"name": "web", "version": "1.0.0"},
                  "templates": [{"name": "templates/big.yaml",
                                 "data": b64(blob_bytes(500 * KIB, 7))}]},
        "manifest": "---\n# Source: web/templates/big.yaml\n",
    }  # fmt: skip
    encoded = b64(gzip.compress(json.dumps(release).encode())).encode()
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "helm.sh/release.v1",
            "metadata": {
                "name": "sh.helm.release.v1.web.v1",
                "labels": {"name": "web", "owner": "helm", "status": status, "version": "1"},
            },
            "data": {"release": b64(encoded)},
        }
    )


def nested(levels: int) -> str:
    """JSON of ``{"a": {"a": ... 1}}``, ``levels`` objects deep, written as text: no JSON
    library on either side of the test has to recurse that deep to make it."""
    return '{"a":' * levels + "1" + "}" * levels


def blob(name: str, *, deep: int = 0, size: int = 1, extra: str = "", version: str = "") -> str:
    spec = f'{{"size":{size}' + (f',"deep":{nested(deep)}' if deep else "") + extra + "}"
    metadata = {"name": name, **({"resourceVersion": version} if version else {})}
    head = json.dumps({"apiVersion": f"{GROUP}/{VERSION}", "kind": "Blob", "metadata": metadata})
    return head[:-1] + f',"spec":{spec}}}'


def at_current_version(path: str, make: Callable[[str], str]) -> Callable[[Ctx], Awaitable[str]]:
    """A replacement (PUT) of the object at ``path``, made by ``make`` with its current
    resourceVersion: custom resources allow no unconditional update."""

    async def body(ctx: Ctx) -> str:
        return make(await ctx.version(path))

    return body


def podset(name: str, *, deep: int = 0, replicas: int = 0, version: str = "") -> str:
    template_spec = (
        '{"containers":[{"name":"c","image":"' + IMAGE + '",'
        '"resources":{"requests":{"cpu":"100m","memory":"64Mi"}}}]'
        + (f',"x-deep":{nested(deep)}' if deep else "")
        + "}"
    )
    head = json.dumps(
        {
            "apiVersion": "tally.dev/v1alpha1",
            "kind": "PodSet",
            "metadata": {"name": name, **({"resourceVersion": version} if version else {})},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": "TEMPLATE"},
            },
        }
    )
    return head.replace('"TEMPLATE"', template_spec)


def pod_json(name: str, containers: int = 1) -> str:
    requests = {"cpu": "10m", "memory": "8Mi"}
    each = [builders.container(f"c{index}", requests, image=IMAGE) for index in range(containers)]
    return json.dumps(builders.pod(name, labels={"app": name}, containers=each, with_kind=True))


def delete_options(**preconditions: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions})


def with_uid(path: str, *, wrong: bool = False) -> Callable[[Ctx], Awaitable[str]]:
    async def body(ctx: Ctx) -> str:
        uid = "00000000-0000-4000-8000-000000000000" if wrong else await ctx.uid(path)
        return delete_options(uid=uid)

    return body


def with_version(path: str, *, stale: bool = False) -> Callable[[Ctx], Awaitable[str]]:
    async def body(ctx: Ctx) -> str:
        version = "1" if stale else await ctx.version(path)
        return delete_options(resourceVersion=version)

    return body


def pod_status(name: str) -> str:
    """What a kubelet writes once the pod runs (through the status subresource)."""
    return json.dumps(
        {"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-27T00:00:00Z"}
        ], "containerStatuses": [
            {"name": "c0", "image": IMAGE, "imageID": "", "ready": True, "restartCount": 0,
             "state": {"running": {"startedAt": "2026-11-27T00:00:00Z"}}}
        ]}}
    )  # fmt: skip


def corpus() -> list[Request]:
    under_1mib = MIB - 4 * KIB
    # fmt: off
    return [
        # ConfigMaps: an UPDATE review carries the object and the object it replaces.
        Request("cm 100 KiB create", "POST", core("configmaps"), config_map("c100k", 100 * KIB)),
        Request("cm 600 KiB create", "POST", core("configmaps"), config_map("c600k", 600 * KIB)),
        Request("cm ~1 MiB create", "POST", core("configmaps"), config_map("c1m", under_1mib)),
        Request(
            "cm over 1 MiB create", "POST", core("configmaps"), config_map("cover", MIB + 1)
        ),
        Request(
            "cm 600 KiB update",
            "PUT",
            core("configmaps", "c600k"),
            config_map("c600k", 600 * KIB, seed=1),
        ),
        Request(
            "cm ~1 MiB update",
            "PUT",
            core("configmaps", "c1m"),
            config_map("c1m", under_1mib, seed=1),
        ),
        Request(
            "cm merge patch",
            "PATCH",
            core("configmaps", "c100k"),
            '{"metadata":{"labels":{"merged":"yes"}}}',
            MERGE,
        ),
        Request(
            "cm json patch",
            "PATCH",
            core("configmaps", "c100k"),
            '[{"op":"add","path":"/data/extra","value":"1"}]',
            JSON_PATCH,
        ),
        Request(
            "cm strategic patch",
            "PATCH",
            core("configmaps", "c100k"),
            '{"data":{"strategic":"2"}}',
            STRATEGIC,
        ),
        Request(
            "cm json patch that fails its test",
            "PATCH",
            core("configmaps", "c100k"),
            '[{"op":"test","path":"/data/extra","value":"2"}]',
            JSON_PATCH,
        ),
        Request(
            "cm apply create",
            "PATCH",
            core("configmaps", "capply"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: capply}\ndata: {k: one}\n",
            APPLY,
            (("fieldManager", "first"),),
        ),
        Request(
            "cm apply conflict",
            "PATCH",
            core("configmaps", "capply"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: capply}\ndata: {k: two}\n",
            APPLY,
            (("fieldManager", "second"),),
        ),
        Request(
            "cm apply forced",
            "PATCH",
            core("configmaps", "capply"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: capply}\ndata: {k: two}\n",
            APPLY,
            (("fieldManager", "second"), ("force", "true")),
        ),
        Request(
            "cm dry-run create ~1 MiB",
            "POST",
            core("configmaps"),
            config_map("cdry", under_1mib),
            query=(("dryRun", "All"),),
        ),
        Request(
            "cm dry-run update",
            "PUT",
            core("configmaps", "c1m"),
            config_map("c1m", under_1mib, seed=2),
            query=(("dryRun", "All"),),
        ),
        Request(
            "cm delete, wrong uid",
            "DELETE",
            core("configmaps", "c100k"),
            with_uid(core("configmaps", "c100k"), wrong=True),
        ),
        Request(
            "cm delete, stale resourceVersion",
            "DELETE",
            core("configmaps", "c100k"),
            with_version(core("configmaps", "c100k"), stale=True),
        ),
        Request(
            "cm delete, current resourceVersion",
            "DELETE",
            core("configmaps", "c100k"),
            with_version(core("configmaps", "c100k")),
        ),
        Request(
            "cm dry-run delete", "DELETE", core("configmaps", "c600k"), query=(("dryRun", "All"),)
        ),
        # Secrets (data is base64: the JSON is a third larger than the Secret).
        Request("secret 100 KiB create", "POST", core("secrets"), secret("s100k", 100 * KIB)),
        Request("secret 600 KiB create", "POST", core("secrets"), secret("s600k", 600 * KIB)),
        Request("secret ~1 MiB create", "POST", core("secrets"), secret("s1m", under_1mib)),
        Request(
            "secret 700 KiB update",
            "PUT",
            core("secrets", "s600k"),
            secret("s600k", 700 * KIB, seed=1),
        ),
        Request(
            "secret merge patch",
            "PATCH",
            core("secrets", "s1m"),
            '{"metadata":{"annotations":{"rotated":"yes"}}}',
            MERGE,
        ),
        Request("helm release create", "POST", core("secrets"), helm_release("deployed")),
        Request(
            "helm release superseded",
            "PUT",
            core("secrets", "sh.helm.release.v1.web.v1"),
            helm_release("superseded"),
        ),
        Request(
            "secret delete, uid",
            "DELETE",
            core("secrets", "s100k"),
            with_uid(core("secrets", "s100k")),
        ),
        # Custom resources, preserve-unknown-fields, as deep as the API server stores.
        Request("cr nested 2 000 create", "POST", blobs(), blob("deep2k", deep=2000)),
        Request("cr nested 9 000 create", "POST", blobs(), blob("deep9k", deep=9000)),
        Request(
            "cr nested 9 000 update",
            "PUT",
            blobs("deep9k"),
            at_current_version(
                blobs("deep9k"), lambda v: blob("deep9k", deep=9000, size=2, version=v)
            ),
        ),
        Request(
            "cr nested 9 000 merge patch", "PATCH", blobs("deep9k"), '{"spec":{"size":3}}', MERGE
        ),
        Request(
            "cr nested 9 000 status write",
            "PUT",
            blobs("deep9k", "status"),
            at_current_version(
                blobs("deep9k"),
                lambda v: blob("deep9k", deep=9000, size=3, extra=',"note":"status"', version=v),
            ),
        ),
        Request("cr nested 10 001 create", "POST", blobs(), blob("deep10k", deep=10_001)),
        Request(
            "cr 5 000-digit integer", "POST", blobs(), blob("hugeint", extra=',"n":' + "9" * 5000)
        ),
        Request(
            "cr dry-run create nested 9 000",
            "POST",
            blobs(),
            blob("deepdry", deep=9000),
            query=(("dryRun", "All"),),
        ),
        Request("cr delete, uid", "DELETE", blobs("deep2k"), with_uid(blobs("deep2k"))),
        # PodSets whose template is nested as deep (template.spec is free-form).
        Request("podset nested 2 000 create", "POST", podsets(), podset("ps2k", deep=2000)),
        Request("podset nested 9 000 create", "POST", podsets(), podset("ps9k", deep=9000)),
        Request(
            "podset nested 9 000 update",
            "PUT",
            podsets("ps9k"),
            at_current_version(podsets("ps9k"), lambda v: podset("ps9k", deep=9000, version=v)),
            retry_conflicts=True,
        ),
        Request(
            "podset scale to 0", "PATCH", podsets("ps9k", "scale"), '{"spec":{"replicas":0}}', MERGE
        ),
        # Pods.
        Request("pod with 50 containers", "POST", core("pods"), pod_json("fifty", containers=50)),
        Request("pod create", "POST", core("pods"), pod_json("one")),
        Request(
            "pod status, as a kubelet writes it",
            "PATCH",
            core("pods", "one", "status"),
            pod_status("one"),
            STRATEGIC,
        ),
        Request(
            "pod label json patch",
            "PATCH",
            core("pods", "one"),
            '[{"op":"add","path":"/metadata/labels/tier","value":"web"}]',
            JSON_PATCH,
        ),
        Request(
            "pod to Terminating scope",
            "PATCH",
            core("pods", "one"),
            '{"spec":{"activeDeadlineSeconds":3600}}',
            STRATEGIC,
        ),
        Request(
            "pod dry-run create", "POST", core("pods"), pod_json("dry"), query=(("dryRun", "All"),)
        ),
        Request(
            "pod delete, stale resourceVersion",
            "DELETE",
            core("pods", "fifty"),
            with_version(core("pods", "fifty"), stale=True),
        ),
        Request(
            "pod delete now",
            "DELETE",
            core("pods", "fifty"),
            '{"apiVersion":"v1","kind":"DeleteOptions","gracePeriodSeconds":0}',
        ),
        # Services, PVCs.
        Request(
            "service create",
            "POST",
            core("services"),
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": "web"},
                    "spec": {"ports": [{"port": 80}], "selector": {"app": "one"}},
                }
            ),
        ),
        Request(
            "service merge patch",
            "PATCH",
            core("services", "web"),
            '{"metadata":{"labels":{"x":"y"}}}',
            MERGE,
        ),
        Request(
            "pvc create",
            "POST",
            core("persistentvolumeclaims"),
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            ),
        ),
        Request(
            "pvc label strategic patch",
            "PATCH",
            core("persistentvolumeclaims", "data"),
            '{"metadata":{"labels":{"x":"y"}}}',
            STRATEGIC,
        ),
    ]
    # fmt: on


def normalized(message: str, namespace: str) -> str:
    message = message.replace(namespace, "<ns>")
    message = UUID.sub("<uid>", message)
    return VERSION_IN.sub(r"\1\2<rv>", message)


async def run_corpus(api: RawApi, namespace: str) -> list[Outcome]:
    ctx = Ctx(namespace, api)
    outcomes = []
    for request in corpus():
        for _ in range(5):
            body = request.body
            if callable(body):
                body = await body(ctx)
            answer = await api.send(
                request.method,
                ctx.path(request.path),
                body,
                content_type=request.content_type,
                query=request.query,
            )
            if not (request.retry_conflicts and answer.status == 409):
                break
        outcomes.append(Outcome(request.name, answer.status, normalized(answer.message, namespace)))
    return outcomes


def report(expected: list[Outcome], found: list[Outcome]) -> str:
    lines = [
        f"{e.name}: upstream {e.status} {e.message[:160]!r} | here {f.status} {f.message[:160]!r}"
        for e, f in zip(expected, found, strict=True)
        if e != f
    ]
    return "\n".join(lines)


# -- the three clusters -----------------------------------------------------------------------


@dataclass
class Side:
    """One cluster's namespace: its quotas, and the outcome of the corpus there."""

    api: client.ApiClient
    raw: RawApi
    namespace: str
    team: str
    cluster_quota: str = ""
    outcomes: list[Outcome] = field(default_factory=list)


def install_crds(plane: ControlPlane) -> None:
    plane.kubectl("apply", "-f", str(CRDS / "podsets.tally.dev.yaml"))
    plane.kubectl("apply", "-f", str(CRDS / "clusterquotas.tally.dev.yaml"))
    plane.kubectl("apply", "-f", "-", input=json.dumps(CRD))
    for name in ("podsets.tally.dev", "clusterquotas.tally.dev", f"{PLURAL}.{GROUP}"):
        plane.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")


async def quota_used(api: client.ApiClient, namespace: str) -> dict[str, int]:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota("generous", namespace)
    status = api.sanitize_for_serialization(quota).get("status") or {}
    return {name: parse_quantity(value).nanos for name, value in (status.get("used") or {}).items()}


async def cluster_quota_used(api: client.ApiClient, name: str) -> dict[str, int]:
    found = await client.CustomObjectsApi(api).get_cluster_custom_object(
        "tally.dev", "v1alpha1", "clusterquotas", name
    )
    used = ((found.get("status") or {}).get("total") or {}).get("used") or {}
    return {resource: parse_quantity(value).nanos for resource, value in used.items()}


@contextlib.asynccontextmanager
async def side(
    plane: ControlPlane, api: client.ApiClient, *, cluster_quota: bool
) -> AsyncIterator[Side]:
    team = uuid.uuid4().hex[:8]
    namespace = f"e2e-corpus-{team}"
    core = client.CoreV1Api(api)
    custom = client.CustomObjectsApi(api)
    await core.create_namespace(
        {"metadata": {"name": namespace, "labels": {"tally.dev/e2e": "true", "team": team}}}
    )
    name = f"e2e-corpus-{team}"
    try:
        await wait_for_default_service_account(api, namespace)
        await wait_for_root_ca_configmap(api, namespace)
        await core.create_namespaced_resource_quota(
            namespace, {"metadata": {"name": "generous"}, "spec": {"hard": QUOTA_HARD}}
        )
        await eventually(
            lambda: quota_used(api, namespace),
            until=lambda used: set(used) == set(QUOTA_HARD),
            within=SETTLE_WITHIN_S,
            what="the quota's first status",
        )
        if cluster_quota:
            await custom.create_cluster_custom_object(
                "tally.dev", "v1alpha1", "clusterquotas",
                {
                    "apiVersion": "tally.dev/v1alpha1",
                    "kind": "ClusterQuota",
                    "metadata": {"name": name},
                    "spec": {
                        "namespaceSelector": {"matchLabels": {"team": team}},
                        "measures": [{
                            "name": MEASURE,
                            "resource": {"group": GROUP, "resource": PLURAL},
                            "expression": "object.spec.size",
                            "when": "has(object.spec.size)",
                        }],
                        "quota": {"hard": CLUSTER_QUOTA_HARD},
                    },
                },
            )  # fmt: skip
            # Its first status is written once tally's webhook rules cover what it limits.
            await eventually(
                lambda: cluster_quota_used(api, name),
                until=lambda used: set(used) == set(CLUSTER_QUOTA_HARD),
                within=SETTLE_WITHIN_S,
                what="the ClusterQuota's first status",
            )
        async with RawApi(plane.kubeconfig) as raw:
            yield Side(api, raw, namespace, team, name if cluster_quota else "")
    finally:
        if cluster_quota:
            with contextlib.suppress(client.ApiException):
                await custom.delete_cluster_custom_object(
                    "tally.dev", "v1alpha1", "clusterquotas", name
                )
        with contextlib.suppress(client.ApiException):
            await core.delete_namespace(namespace)


def wait_until_upstream_counts(plane: ControlPlane, names: list[str]) -> None:
    """Until upstream's quota controller counts ``names`` (``count/`` of kinds whose CRDs are
    new): it finds new kinds by discovery, every 30 s, and a quota synced before then gets a
    status without them that it completes only at its next full resync (5 minutes) or when
    its spec changes. A probe quota's spec is changed until its status has them all."""
    namespace = f"e2e-corpus-probe-{uuid.uuid4().hex[:6]}"
    plane.kubectl("create", "namespace", namespace)
    try:
        loop_deadline = time.monotonic() + 120
        bump = 0
        while True:
            hard = {name: str(100 + bump) for name in names}
            quota = {"apiVersion": "v1", "kind": "ResourceQuota",
                     "metadata": {"name": "probe", "namespace": namespace},
                     "spec": {"hard": hard}}  # fmt: skip
            plane.kubectl("apply", "-f", "-", input=json.dumps(quota))
            time.sleep(3)
            found = json.loads(
                plane.kubectl("get", "quota", "probe", "-n", namespace, "-o", "json").stdout
            )
            if set(names) <= set((found.get("status") or {}).get("used") or {}):
                return
            assert time.monotonic() < loop_deadline, f"upstream never counted {names}"
            bump += 1
    finally:
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def reference_crds(reference_plane: ControlPlane) -> ControlPlane:
    install_crds(reference_plane)
    wait_until_upstream_counts(
        reference_plane, [f"count/{PLURAL}.{GROUP}", "count/podsets.tally.dev"]
    )
    return reference_plane


@pytest.fixture(scope="module")
def operator_crds(control_plane: ControlPlane) -> ControlPlane:
    install_crds(control_plane)
    return control_plane


@pytest.fixture(scope="module")
def upstream_outcomes() -> dict[str, Any]:
    """The reference plane's answers and usage, filled by the first test, read by the others."""
    return {}


def tally_configurations(plane: ControlPlane) -> list[str]:
    listed = plane.kubectl("get", "validatingwebhookconfigurations", "-o", "name").stdout
    return [name for name in listed.split() if "tally" in name]


async def test_upstream_alone(
    reference_crds: ControlPlane,
    reference_api: client.ApiClient,
    upstream_outcomes: dict[str, Any],
) -> None:
    # The oracle: nothing of tally's may judge here.
    assert tally_configurations(reference_crds) == []
    async with side(reference_crds, reference_api, cluster_quota=False) as here:
        outcomes = await run_corpus(here.raw, here.namespace)
        used = await settled(lambda: quota_used(reference_api, here.namespace))
    assert len(outcomes) >= 40
    # Anchors, so that the comparison cannot pass by both sides failing alike.
    by_name = {o.name: o for o in outcomes}
    assert by_name["cm ~1 MiB update"].status == 200
    assert by_name["secret 700 KiB update"].status == 200
    assert by_name["helm release superseded"].status == 200
    assert by_name["cr nested 9 000 create"].status == 201
    assert by_name["cr nested 9 000 update"].status == 200
    assert by_name["podset nested 9 000 create"].status == 201
    assert by_name["pod with 50 containers"].status == 201
    assert by_name["cm over 1 MiB create"].status == 422
    assert by_name["cr nested 10 001 create"].status == 400
    assert by_name["cr 5 000-digit integer"].status == 400
    assert by_name["cm apply conflict"].status == 409
    assert by_name["cm delete, wrong uid"].status == 409
    upstream_outcomes["outcomes"] = outcomes
    upstream_outcomes["used"] = used


async def settled(read: Callable[[], Awaitable[dict[str, int]]]) -> dict[str, int]:
    """The usage once it has stopped changing (the same three reads in a row, 1 s apart)."""
    readings: list[dict[str, int]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_WITHIN_S
    while loop.time() < deadline:
        readings = [*readings[-2:], await read()]
        if len(readings) == 3 and readings[0] == readings[1] == readings[2]:
            return readings[-1]
        await asyncio.sleep(1.0)
    raise AssertionError(f"usage never settled: {readings}")


def expected_measure(outcomes: list[Outcome]) -> int:
    """The blob-size measure's total by hand: the blobs the corpus leaves, with the size their
    last successful write gave them."""
    sizes = {"deep9k": 3}  # created with 1, updated to 2, patched to 3 (the status write keeps it)
    assert {o.name: o.status for o in outcomes}["cr nested 9 000 merge patch"] == 200
    return sum(sizes.values()) * 10**9


def check_like_upstream(
    here: Side, outcomes: list[Outcome], upstream: Mapping[str, Any], used: dict[str, int]
) -> None:
    assert outcomes == upstream["outcomes"], report(upstream["outcomes"], outcomes)
    assert used == upstream["used"]


async def test_tally_in_operator_mode(
    operator_crds: ControlPlane,
    operator: RunningOperator,
    api: client.ApiClient,
    upstream_outcomes: dict[str, Any],
) -> None:
    assert upstream_outcomes, "test_upstream_alone runs first"
    async with side(operator_crds, api, cluster_quota=True) as here:
        outcomes = await run_corpus(here.raw, here.namespace)
        used = await settled(lambda: quota_used(api, here.namespace))
        total = await settled(lambda: cluster_quota_used(api, here.cluster_quota))
    check_like_upstream(here, outcomes, upstream_outcomes, used)
    assert total == {
        **{name: upstream_outcomes["used"][name] for name in QUOTA_HARD},
        MEASURE: expected_measure(outcomes),
        "podsets.tally.dev/requests.cpu": 0,  # every PodSet has 0 replicas
    }
    assert "Traceback" not in operator.log_text()


@pytest.fixture(scope="module")
def tally_on_reference(
    reference_crds: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TallyProcess]:
    process = TallyProcess(
        reference_crds.kubeconfig,
        tmp_path_factory.mktemp("tally-reference") / "tally.log",
        bin_dir=reference_crds.bin_dir,
    )
    try:
        process.start(timeout=START_BOUND_S)
        assert "tally enforces ClusterQuotas only" in process.log_text(tail=10_000)
        yield process
    finally:
        process.kill()
        reference_crds.kubectl(
            "delete", process.webhook_configuration, "--ignore-not-found", check=False
        )


async def test_tally_beside_upstream(
    reference_crds: ControlPlane,
    tally_on_reference: TallyProcess,
    reference_api: client.ApiClient,
    upstream_outcomes: dict[str, Any],
) -> None:
    assert upstream_outcomes, "test_upstream_alone runs first"
    async with side(reference_crds, reference_api, cluster_quota=True) as here:
        outcomes = await run_corpus(here.raw, here.namespace)
        used = await settled(lambda: quota_used(reference_api, here.namespace))
        total = await settled(lambda: cluster_quota_used(reference_api, here.cluster_quota))
    check_like_upstream(here, outcomes, upstream_outcomes, used)
    assert total == {
        **{name: upstream_outcomes["used"][name] for name in QUOTA_HARD},
        MEASURE: expected_measure(outcomes),
        "podsets.tally.dev/requests.cpu": 0,
    }
    assert "Traceback" not in tally_on_reference.log_text(tail=1_000_000)
