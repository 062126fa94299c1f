"""Helpers for the PodSet robustness and differential tests: bodies, reads, and a pod watch.

``PodSet`` (``tally.dev/v1alpha1``, tally's controller) and ``ReplicaSet`` (``apps/v1``,
kube-controller-manager's replicaset controller) are handled alike through :class:`Workload`,
so one script can run against either.

:class:`OwnedPodWatch` follows the pods a workload controls through a watch (not by polling),
so no transient count between two polls goes unseen: every change is checked against a bound
the test sets (``ceiling``: never more active pods than this; ``floor``: never fewer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, watch

from builders import IMAGE, NO_SCHEDULER
from tally_e2e import ControlPlane

CRD = Path(__file__).resolve().parents[2] / "crds" / "podsets.tally.dev.yaml"


def install_podset_crd(plane: ControlPlane) -> None:
    plane.kubectl("apply", "-f", str(CRD))
    plane.kubectl("wait", "--for=condition=Established", "crd/podsets.tally.dev", "--timeout=60s")


@dataclass(frozen=True)
class Workload:
    """How to reach one kind of replicated workload through the API."""

    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    def body(
        self, name: str, replicas: int, *, min_ready: int = 0, played: bool = False
    ) -> dict[str, Any]:
        """``played``: its pods stay unbound (``NO_SCHEDULER``) and the test writes their
        status, as a kubelet would but on cue."""
        labels = {"app": name}
        body = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "minReadySeconds": min_ready,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {"name": "app", "image": IMAGE,
                             "resources": {"requests": {"cpu": "100m"}}}
                        ]
                    },
                },
            },
        }  # fmt: skip
        if played:
            body["spec"]["template"]["spec"]["schedulerName"] = NO_SCHEDULER
        return body

    async def create(
        self, api: client.ApiClient, namespace: str, name: str, replicas: int, **kw: Any
    ) -> None:
        await client.CustomObjectsApi(api).create_namespaced_custom_object(
            self.group, self.version, namespace, self.plural, self.body(name, replicas, **kw)
        )

    async def get(self, api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
        return dict(
            await client.CustomObjectsApi(api).get_namespaced_custom_object(
                self.group, self.version, namespace, self.plural, name
            )
        )

    async def scale(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        replicas: int,
        *,
        subresource: bool = False,
    ) -> None:
        """Set ``spec.replicas``: a patch of the object, or (``subresource``) of its ``/scale``,
        as ``kubectl scale`` does (a PodSet's validation webhook sees only the former)."""
        custom = client.CustomObjectsApi(api)
        patch = (
            custom.patch_namespaced_custom_object_scale
            if subresource
            else custom.patch_namespaced_custom_object
        )
        await patch(
            self.group,
            self.version,
            namespace,
            self.plural,
            name,
            {"spec": {"replicas": replicas}},
            _content_type="application/merge-patch+json",
        )

    def controls(self, pod: dict[str, Any], name: str) -> bool:
        return any(
            ref.get("controller") and ref.get("kind") == self.kind and ref.get("name") == name
            for ref in pod["metadata"].get("ownerReferences") or []
        )

    async def owned_pods(
        self, api: client.ApiClient, namespace: str, name: str
    ) -> list[dict[str, Any]]:
        """Active (not being deleted) pods this workload controls, as raw JSON."""
        pods = await list_pods(api, namespace)
        return [
            p for p in pods if self.controls(p, name) and not p["metadata"].get("deletionTimestamp")
        ]


PODSET = Workload("PodSet", "tally.dev", "v1alpha1", "podsets")
REPLICASET = Workload("ReplicaSet", "apps", "v1", "replicasets")


async def list_pods(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    response = await client.CoreV1Api(api).list_namespaced_pod(namespace, _preload_content=False)
    return list(json.loads(await response.read())["items"])


@dataclass
class OwnedPodWatch:
    """The active pods one workload controls, kept from a watch; bounds checked on every event.

    Start it before the workload creates anything. ``ceiling`` / ``floor`` may be changed at
    any time by the test; every event that leaves the count outside them is recorded in
    ``violations`` (with the count and the bound), and ``max_seen`` keeps the highest count.
    """

    api: client.ApiClient
    namespace: str
    workload: Workload
    name: str
    ceiling: int = 0
    floor: int = 0
    active: set[str] = field(default_factory=set)
    max_seen: int = 0
    violations: list[str] = field(default_factory=list)
    events: int = 0
    window: list[int] | None = None
    """Every count since :meth:`stable` began watching (None outside it)."""
    _task: asyncio.Task[None] | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def count(self) -> int:
        return len(self.active)

    async def start(self) -> None:
        core = client.CoreV1Api(self.api)
        listed = await core.list_namespaced_pod(self.namespace)
        for pod in listed.items:
            raw = self.api.sanitize_for_serialization(pod)
            self._apply("ADDED", raw)
        self._task = asyncio.create_task(self._run(listed.metadata.resource_version))

    async def _run(self, resource_version: str) -> None:
        core = client.CoreV1Api(self.api)
        while True:
            stream = watch.Watch().stream(
                core.list_namespaced_pod,
                self.namespace,
                resource_version=resource_version,
                timeout_seconds=600,
                allow_watch_bookmarks=False,
            )
            async for event in stream:
                raw = event["raw_object"]
                resource_version = raw["metadata"].get("resourceVersion", resource_version)
                self._apply(str(event["type"]), raw)

    def _apply(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if (
            kind != "DELETED"
            and self.workload.controls(pod, self.name)
            and not pod["metadata"].get("deletionTimestamp")
        ):
            self.active.add(name)
        else:
            self.active.discard(name)
        self.events += 1
        count = len(self.active)
        self.max_seen = max(self.max_seen, count)
        if self.window is not None:
            self.window.append(count)
        if count > self.ceiling:
            self.violations.append(f"{count} active pods > ceiling {self.ceiling} ({kind} {name})")
        if count < self.floor:
            self.violations.append(f"{count} active pods < floor {self.floor} ({kind} {name})")
        self._changed.set()

    async def until(self, count: int, within: float) -> None:
        """Wait until exactly ``count`` active pods; AssertionError with the state otherwise."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while self.count != count:
            self._changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(
                    f"timed out after {within} s waiting for {count} pods of {self.name}; "
                    f"have {self.count} (max seen {self.max_seen}, {self.events} events)"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 1.0))

    async def stable(self, count: int, seconds: float) -> None:
        """Exactly ``count`` active pods now and at every event for the next ``seconds``."""
        assert self.count == count, f"{self.name}: {self.count} pods, expected {count}"
        self.window = []
        await asyncio.sleep(seconds)
        counts, self.window = self.window, None
        assert all(c == count for c in counts), f"{self.name}: counts {counts}, expected {count}"
        assert self.count == count, f"{self.name}: {self.count} pods, expected {count}"

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
