"""tally.clusterquota.admission: admission's compare-and-swap writes of a ClusterQuota, and the
read after a lost one.

A fake writer plays the API server's compare-and-swap (a PUT carrying another resourceVersion
than the stored one fails). Totals and shares are worked out by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tally.clusterquota import quota as cluster
from tally.clusterquota.admission import ClusterQuotaBinding
from tally.machinery.cache import Store
from tally.machinery.errors import Conflict
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit

Obj = Mapping[str, Any]


def cq(used: dict[str, str], shares: dict[str, dict[str, str]], *, version: int = 1,
       hard: str = "10") -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "ClusterQuota",
        "metadata": {"name": "team", "uid": "u-team", "resourceVersion": str(version)},
        "spec": {"quota": {"hard": {"pods": hard}}, "selector": {"matchLabels": {"team": "a"}}},
        "status": {
            "total": {"hard": {"pods": hard}, "used": used},
            "namespaces": [
                {"namespace": ns, "status": {"used": share}} for ns, share in shares.items()
            ],
            "namespaceCount": 3,
        },
    }


def rv(obj: Obj) -> int:
    return int(obj["metadata"]["resourceVersion"])


class FakeWriter:
    """The API server's side of the writes: one stored copy, compare-and-swap on it."""

    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored = stored
        self.puts: list[dict[str, Any]] = []
        self.refreshed: list[str] = []

    def freshest(self, cached: Obj) -> Obj:
        return self.stored if rv(self.stored) >= rv(cached) else cached

    async def put_status(self, obj: Obj) -> Obj:
        self.puts.append(dict(obj["status"]))
        if rv(obj) != rv(self.stored):
            raise Conflict("clusterquotas/team: the object has been modified")
        self.stored = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(rv(obj) + 1)}}
        return self.stored

    async def refresh(self, name: str) -> None:
        self.refreshed.append(name)


class NoSelection:
    def selecting(self, namespace: str) -> list[Obj]:
        return []


def binding(stored: dict[str, Any]) -> tuple[ClusterQuotaBinding, FakeWriter]:
    store: Store[Obj] = Store(lambda obj: obj)
    store.upsert(stored)
    writer = FakeWriter(stored)
    return ClusterQuotaBinding(NoSelection(), store, writer), writer


def judged(
    copy: Obj, namespace: str, pods: int
) -> tuple[dict[str, Any], dict[str, dict[str, Quantity]]]:
    """What a pass in ``namespace`` that charged ``pods`` pods on ``copy`` hands to ``write``:
    the view with its new total, and its charge."""
    view = cluster.as_resource_quota(copy, namespace)
    view["status"]["used"] = {"pods": str(int(view["status"]["used"]["pods"]) + pods)}
    return view, {namespace: {"pods": Quantity.parse(str(pods))}}


def shares(status: Obj) -> dict[str, Any]:
    return {entry["namespace"]: entry["status"]["used"] for entry in status["namespaces"]}


async def test_a_pass_is_written_as_judged_its_namespace_s_share_grown() -> None:
    start = cq({"pods": "3"}, {"a": {"pods": "1"}, "b": {"pods": "2"}})
    quotas, writer = binding(start)
    view = await quotas.write(*judged(start, "a", 2))

    assert {"pods": "5"} == writer.stored["status"]["total"]["used"]
    assert {"a": {"pods": "3"}, "b": {"pods": "2"}} == shares(writer.stored["status"])
    assert ("2", "a") == (view["metadata"]["resourceVersion"], view["metadata"]["namespace"])
    assert {"pods": "5"} == view["status"]["used"]


async def test_a_pass_judged_on_an_older_copy_fails_at_once() -> None:
    start = cq({"pods": "1"}, {"a": {"pods": "1"}})
    quotas, writer = binding(start)
    stale = judged(start, "a", 1)
    writer.stored = cq({"pods": "2"}, {"a": {"pods": "2"}}, version=2)
    with pytest.raises(Conflict):
        await quotas.write(*stale)
    assert [] == writer.puts


async def test_after_a_lost_write_the_object_is_read_again_only_when_nothing_newer_is_known() -> (
    None
):
    start = cq({"pods": "1"}, {"a": {"pods": "1"}})
    quotas, writer = binding(start)
    view = cluster.as_resource_quota(start, "a")

    await quotas.refresh(view)
    assert ["team"] == writer.refreshed

    writer.stored = cq({"pods": "2"}, {"a": {"pods": "2"}}, version=2)
    await quotas.refresh(view)
    assert ["team"] == writer.refreshed
