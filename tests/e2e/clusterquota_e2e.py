"""Helpers for the ClusterQuota end-to-end tests: a :class:`Team` of namespaces and the quotas a
test makes (all deleted afterwards), bursts of concurrent pod creates, and waiting for a
ClusterQuota's status to match what exists.

The fixtures ``cq_crd`` (the CRD, once per module) and ``team`` (a fresh :class:`Team` per test,
with tally running) are defined here and registered by each test module with
``pytest_plugins = ["clusterquota_e2e"]``, so the modules share them instead of copying them.
The modules import this one before pytest registers it, too late for pytest to rewrite its
asserts (it has none), hence PYTEST_DONT_REWRITE: without it pytest warns.

Refusals are read as the API server reports a validating webhook's denial (upstream's words):
:data:`DENIED` followed by the quota message. A create that fails any other way (a 500 for a
timed-out evaluation, a 409, a dropped connection) is not a refusal: it raises, and the test
fails with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import pytest_asyncio
from kubernetes_asyncio import client

import builders
from tally_e2e import ControlPlane, RunningOperator, eventually, wait_for_default_service_account

CRD: Final = Path(__file__).resolve().parents[2] / "crds" / "clusterquotas.tally.dev.yaml"
GROUP: Final = "tally.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "clusterquotas"
MERGE_PATCH: Final = "application/merge-patch+json"
DENIED: Final = 'admission webhook "quota.tally.dev" denied the request: '
"""How the API server words a validating webhook's denial; the quota's message follows."""

CONVERGE_WITHIN_S: Final = 10.0
"""How long a status may take to catch up with what exists."""

Used = dict[str, str]
"""A ``status.used`` map: resource name to quantity, as the API server stores it."""


APPLIED_CRD: Final = CRD.with_name("appliedclusterquotas.tally.dev.yaml")
APPLIED_PLURAL: Final = "appliedclusterquotas"


@pytest.fixture(scope="module")
def cq_crd(control_plane: ControlPlane) -> None:
    """The ClusterQuota CRD and the AppliedClusterQuota CRD (what tally writes of each into the
    namespaces it selects)."""
    for crd in (CRD, APPLIED_CRD):
        control_plane.kubectl("apply", "-f", str(crd))
    for name in ("clusterquotas.tally.dev", "appliedclusterquotas.tally.dev"):
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{name}",
                              "--timeout=60s")  # fmt: skip


@pytest_asyncio.fixture
async def team(
    cq_crd: None, operator: RunningOperator, api: client.ApiClient
) -> AsyncIterator[Team]:
    created = Team(api)
    try:
        yield created
    finally:
        await created.close()


@dataclass(frozen=True)
class Create:
    """One pod create of a burst: one container ``a``; ``cpu`` is its cpu request (None: no
    requests at all), ``limits`` its limits (None: none). No requests and no limits is a
    BestEffort pod."""

    namespace: str
    name: str
    cpu: str | None = "100m"
    limits: Mapping[str, str] | None = None


class Team:
    """Namespaces labelled ``team=<id>`` (and more that are not), and the ClusterQuotas a
    test makes; all deleted afterwards."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.id = uuid.uuid4().hex[:8]
        self.namespaces: list[str] = []
        self.quotas: list[str] = []

    async def namespace(self, *, member: bool = True) -> str:
        name = f"e2e-cq-{self.id}-{len(self.namespaces)}"
        # Taken before the first await, so concurrent calls get distinct names; close()
        # deletes it whether or not the create below succeeded.
        self.namespaces.append(name)
        labels = {"tally.dev/e2e": "true", **({"team": self.id} if member else {})}
        await self.core.create_namespace(builders.namespace(name, labels=labels))
        await wait_for_default_service_account(self.api, name)
        return name

    async def member_namespaces(self, count: int) -> list[str]:
        """``count`` member namespaces, made concurrently, in order."""
        return list(await asyncio.gather(*(self.namespace() for _ in range(count))))

    async def cluster_quota(
        self, hard: Mapping[str, str], *, scopes: Sequence[str] = (), **spec: Any
    ) -> str:
        """A ClusterQuota selecting the team's members (``spec`` may override the selector)."""
        name = f"cq-{self.id}-{len(self.quotas)}"
        self.quotas.append(name)
        body = builders.cluster_quota(
            name,
            hard,
            selector={"matchLabels": {"team": self.id}},
            quota={"scopes": list(scopes)} if scopes else None,
            spec=spec,
            with_kind=True,
        )
        await self.custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        return name

    async def merge_patch(self, name: str, body: Mapping[str, Any]) -> None:
        """Merge-patch the ClusterQuota ``name``."""
        # The generated method takes _content_type through **kwargs, which its stubs leave
        # out; without it a dict body would be sent as a JSON patch.
        patch: Callable[..., Awaitable[Any]] = self.custom.patch_cluster_custom_object
        await patch(GROUP, VERSION, PLURAL, name, dict(body), _content_type=MERGE_PATCH)

    async def status(self, name: str) -> dict[str, Any]:
        obj = await self.custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        return dict(obj.get("status") or {})

    async def resource_quota(self, namespace: str, name: str, hard: Mapping[str, str]) -> None:
        """A ResourceQuota (deleted with its namespace)."""
        await self.core.create_namespaced_resource_quota(
            namespace, builders.resource_quota(name, hard)
        )

    async def resource_quota_used(self, namespace: str, name: str) -> Used:
        quota = await self.core.read_namespaced_resource_quota(name, namespace)
        return dict((quota.status and quota.status.used) or {})

    async def pod(
        self,
        namespace: str,
        name: str,
        cpu: str | None = "100m",
        limits: Mapping[str, str] | None = None,
    ) -> None:
        requests = None if cpu is None else {"cpu": cpu}
        await self.core.create_namespaced_pod(
            namespace, builders.pod(name, requests, limits, resources="always")
        )

    async def attempt(self, create: Create) -> str | None:
        """Create the pod; None if admitted, else the refusal's message (see module doc)."""
        try:
            await self.pod(create.namespace, create.name, create.cpu, create.limits)
        except client.ApiException as error:
            if error.status != 403 or error.body is None:
                raise
            return str(json.loads(error.body)["message"])
        return None

    async def pod_names(self, namespaces: Iterable[str]) -> dict[str, list[str]]:
        """The pods that exist, by namespace (a LIST each: the truth a status must match)."""
        names: dict[str, list[str]] = {}
        for namespace in namespaces:
            pods = await self.core.list_namespaced_pod(namespace)
            names[namespace] = sorted(pod.metadata.name for pod in pods.items)
        return names

    async def close(self) -> None:
        for name in self.quotas:
            with contextlib.suppress(client.ApiException):
                await self.custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        for namespace in self.namespaces:
            with contextlib.suppress(client.ApiException):
                await self.core.delete_namespace(namespace)


async def burst(team: Team, creates: Sequence[Create]) -> list[tuple[Create, str]]:
    """Every create at once (asyncio.gather; the client keeps up to 100 in flight); returns
    the refused ones with their messages, in the order given."""
    outcomes = await asyncio.gather(*(team.attempt(create) for create in creates))
    return [
        (create, message)
        for create, message in zip(creates, outcomes, strict=True)
        if message is not None
    ]


def used_by_namespace(status: Mapping[str, Any]) -> dict[str, Used]:
    """``status.namespaces`` as {namespace: used}."""
    return {
        entry["namespace"]: dict((entry.get("status") or {}).get("used") or {})
        for entry in status.get("namespaces") or []
    }


def total_used(status: Mapping[str, Any]) -> Used:
    return dict((status.get("total") or {}).get("used") or {})


async def wait_for_status(
    team: Team,
    name: str,
    total: Mapping[str, str],
    by_namespace: Mapping[str, Mapping[str, str]],
    *,
    within: float = CONVERGE_WITHIN_S,
    what: str = "the status",
) -> dict[str, Any]:
    """Wait until ClusterQuota ``name``'s ``status.total.used`` is ``total`` and its
    ``status.namespaces`` lists exactly ``by_namespace`` (a namespace that uses nothing is
    not listed); returns that status."""
    want_total, want_namespaces = dict(total), {ns: dict(u) for ns, u in by_namespace.items()}
    return await eventually(
        lambda: team.status(name),
        until=lambda s: total_used(s) == want_total and used_by_namespace(s) == want_namespaces,
        within=within,
        what=f"{what} of {name}: total {want_total}, namespaces {want_namespaces}",
    )


def exceeded_cluster_quota(name: str, requested: str, used: str, limited: str) -> str:
    """A refusal in upstream's words for a ClusterQuota (``exceeded quota`` with ``cluster``):
    each part ``resource=quantity``, the exceeded names only."""
    return (
        f"{DENIED}exceeded cluster quota: {name}, "
        f"requested: {requested}, used: {used}, limited: {limited}"
    )


def exceeded_quota(name: str, requested: str, used: str, limited: str) -> str:
    """A ResourceQuota's refusal, in upstream's words."""
    return (
        f"{DENIED}exceeded quota: {name}, requested: {requested}, used: {used}, limited: {limited}"
    )


def pods_used(counts: Mapping[str, int]) -> dict[str, Used]:
    """The ``status.namespaces`` a ClusterQuota on ``pods`` has for these pod counts (a
    namespace without pods is not listed)."""
    return {namespace: {"pods": str(count)} for namespace, count in counts.items() if count}
