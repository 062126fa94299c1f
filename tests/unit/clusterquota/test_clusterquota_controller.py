"""tally.clusterquota.controller: a new ClusterQuota's first status waits for admission's rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from tally.clusterquota.controller import (
    FIRST_STATUS_WAIT_S,
    ClusterQuotaController,
    namespace_labels,
)
from tally.evaluators.base import GroupResource
from tally.evaluators.registry import new_registry
from tally.machinery.cache import Store

pytestmark = pytest.mark.unit

PODS = GroupResource("", "pods")


class Writer:
    def __init__(self) -> None:
        self.writes: list[Mapping[str, Any]] = []

    async def update_status(self, cq: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        self.writes.append(status)


def _controller(
    ready: list[bool], now: list[float], status: dict[str, Any] | None = None
) -> tuple[ClusterQuotaController, Writer, dict[str, Any]]:
    cq: dict[str, Any] = {
        "kind": "ClusterQuota",
        "metadata": {"name": "team", "resourceVersion": "7"},
        "spec": {
            "namespaceSelector": {"matchLabels": {"team": "a"}},
            "quota": {"hard": {"pods": "2"}},
        },
        **({"status": status} if status is not None else {}),
    }  # fmt: skip
    cluster_quotas: Store[Any] = Store(lambda obj: obj, name="clusterquotas")
    cluster_quotas.replace([cq], started_at=0)
    namespaces: Store[Any] = Store(namespace_labels, name="namespaces")
    namespaces.replace([{"metadata": {"name": "a1", "labels": {"team": "a"}}}], started_at=0)
    pods: Store[Any] = Store(lambda obj: obj, name="pods")
    pods.replace([], started_at=0)
    writer = Writer()
    controller = ClusterQuotaController(
        new_registry(clock=lambda: 1_700_000_000.0),
        cluster_quotas,
        namespaces,
        {PODS: pods},
        writer,
        admission_ready=lambda: ready[0],
        clock=lambda: now[0],
    )
    return controller, writer, cq


async def test_the_first_status_waits_until_admission_is_asked_about_what_it_limits() -> None:
    # Until tally's webhook rules cover pods, the API server does not ask tally about pod
    # creates: a status saying "in force" (hard: pods 2) would be false, so none is written.
    ready, now = [False], [100.0]
    controller, writer, cq = _controller(ready, now)
    await controller.sync_cluster_quota(cq)
    assert [] == writer.writes
    assert 0 == len(controller.queue)  # asked again shortly (a delayed add), not at once
    ready[0] = True
    await controller.sync_cluster_quota(cq)
    assert [{"pods": "2"}] == [w["total"]["hard"] for w in writer.writes]
    assert {} == controller._first_status_waits


async def test_a_first_status_is_written_anyway_after_the_longest_wait() -> None:
    ready, now = [False], [100.0]
    controller, writer, cq = _controller(ready, now)
    await controller.sync_cluster_quota(cq)
    now[0] += FIRST_STATUS_WAIT_S - 0.1
    await controller.sync_cluster_quota(cq)
    assert [] == writer.writes
    now[0] += 0.1
    await controller.sync_cluster_quota(cq)
    assert 1 == len(writer.writes)
    assert {} == controller._first_status_waits


async def test_later_statuses_do_not_wait() -> None:
    status = {"total": {"hard": {"pods": "2"}, "used": {"pods": "1"}}, "namespaces": []}
    controller, writer, cq = _controller([False], [100.0], status)
    await controller.sync_cluster_quota(cq)
    assert [{"pods": "0"}] == [w["total"]["used"] for w in writer.writes]
