"""One side of a workload differential run (a ReplicaSet on upstream, a PodSet on tally): a
script's calls, checkpoints of the workload's status and pods, its Events, and how two sides'
checkpoints are compared.

Shared by ``test_podset_differential.py`` and ``test_pod_lifecycle_differential.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client
from podset_e2e import Workload

from tally_e2e import eventually

STABLE_AFTER_S = 2.0
ANCHOR_WITHIN_S = 60.0
COUNTED = ("replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas")
QUOTA_MESSAGE = re.compile(r"exceeded quota: .*")

Snapshot = dict[str, Any]


@dataclass
class Side:
    label: str
    api: client.ApiClient
    namespace: str
    workload: Workload
    checkpoints: dict[str, Snapshot] = field(default_factory=dict)

    async def snapshot(self, name: str) -> Snapshot:
        obj = await self.workload.get(self.api, self.namespace, name)
        pods = await self.workload.owned_pods(self.api, self.namespace, name)
        status = obj.get("status") or {}
        conditions = []
        for condition in status.get("conditions") or []:
            found = QUOTA_MESSAGE.search(condition.get("message") or "")
            conditions.append(
                (
                    condition["type"],
                    condition["status"],
                    condition.get("reason"),
                    found.group(0) if found else None,
                )
            )
        return {
            "pods": len(pods),
            **{key: status.get(key, 0) for key in COUNTED},
            "observedCurrent": status.get("observedGeneration") == obj["metadata"]["generation"],
            "conditions": sorted(conditions),
        }

    async def checkpoint(self, label: str, name: str, anchor: Callable[[Snapshot], bool]) -> None:
        """Wait for ``anchor``, then for two equal snapshots STABLE_AFTER_S apart; record it."""

        async def settled() -> tuple[Snapshot, Snapshot]:
            first = await self.snapshot(name)
            await asyncio.sleep(STABLE_AFTER_S)
            return first, await self.snapshot(name)

        first, _ = await eventually(
            settled,
            until=lambda pair: pair[0] == pair[1] and anchor(pair[0]),
            within=ANCHOR_WITHIN_S,
            interval=0.0,
            what=f"{self.label}: checkpoint {label!r}",
        )
        self.checkpoints[label] = first

    async def events(self, name: str) -> list[tuple[str, str, int, str]]:
        """The Events about workload ``name``: type, reason, count and message (the pod name
        in it replaced by ``<pod>``), sorted."""
        response = await client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
        )
        pod = re.compile(rf"pod: {re.escape(name)}-[a-z0-9]+$")
        return sorted(
            (
                str(event.get("type")),
                str(event.get("reason")),
                int(event.get("count") or 0),
                pod.sub("pod: <pod>", str(event.get("message") or "")),
            )
            for event in json.loads(await response.read())["items"]
            if event["involvedObject"].get("kind") == self.workload.kind
        )

    async def event_checkpoint(
        self, label: str, name: str, anchor: list[tuple[str, str, int, str]]
    ) -> None:
        """Wait until the Events are ``anchor`` and unchanged STABLE_AFTER_S later; record them."""

        async def settled() -> tuple[list[Any], list[Any]]:
            first = await self.events(name)
            await asyncio.sleep(STABLE_AFTER_S)
            return first, await self.events(name)

        first, _ = await eventually(
            settled,
            until=lambda pair: pair[0] == pair[1] == anchor,
            within=ANCHOR_WITHIN_S,
            interval=0.0,
            what=f"{self.label}: event checkpoint {label!r}",
        )
        self.checkpoints[label] = {"events": first}

    async def create(self, name: str, replicas: int, **kw: Any) -> None:
        await self.workload.create(self.api, self.namespace, name, replicas, **kw)

    async def scale(self, name: str, replicas: int) -> None:
        await self.workload.scale(self.api, self.namespace, name, replicas)

    async def pod_names(self, name: str) -> list[str]:
        pods = await self.workload.owned_pods(self.api, self.namespace, name)
        return sorted(p["metadata"]["name"] for p in pods)


Script = Callable[[Side], Awaitable[None]]


def counts(pods: int, **status: int) -> Callable[[Snapshot], bool]:
    """An anchor: ``pods`` pods, ``status.replicas == pods`` unless given, current generation."""
    expected = {"replicas": pods, **status}
    return lambda s: (
        s["pods"] == pods
        and s["observedCurrent"]
        and all(s[key] == value for key, value in expected.items())
    )


async def run_both(
    reference: Side, tally: Side, script: Script
) -> list[tuple[str, Snapshot, Snapshot]]:
    await asyncio.gather(script(reference), script(tally))
    assert list(reference.checkpoints) == list(tally.checkpoints)
    return [
        (label, reference.checkpoints[label], tally.checkpoints[label])
        for label in reference.checkpoints
    ]


def assert_same(compared: list[tuple[str, Snapshot, Snapshot]]) -> None:
    differences = [
        f"{label}: upstream {upstream} != tally {tally}"
        for label, upstream, tally in compared
        if upstream != tally
    ]
    assert differences == []
