"""One side of a quota differential run (upstream's quota system, or tally's), and how two
sides' quota statuses are compared: a script's API calls in a namespace of its own, the wait
until the quotas settle, anchors and the numeric comparison.

Shared by ``test_controller_differential.py`` (objects made by hand) and
``test_pod_lifecycle_differential.py`` (pods run by the simulated kubelets).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

import builders
from tally.quota.quantity import parse_quantity
from tally_e2e import eventually, set_pod_status

IMAGE = "registry.example/app:1"
HOLD_FINALIZER = "example.com/hold"
LARGE = "1Pi"
# Both sides fill a quota within a second or two; generous for a loaded machine.
FILL_WITHIN_S = 30.0
# Two reads this far apart must agree before a side counts as settled. Replenishment is
# event-driven on both sides (within 1 s for tally), so 2 s of quiet means done.
STABLE_AFTER_S = 2.0
SETTLE_WITHIN_S = 60.0
# Names validation accepts but no evaluator measures: neither side ever writes a used value.
UNTRACKED = frozenset({"foo.example.com/bar", "limits.example.com/dongle"})


# -- one side of a run ----------------------------------------------------------------------


@dataclass(frozen=True)
class PriorityNames:
    high: str
    low: str


@dataclass
class Side:
    """One control plane's namespace, and the calls a script makes on it."""

    label: str
    api: client.ApiClient
    namespace: str
    priority: PriorityNames
    held: list[str] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    async def quotas(self) -> dict[str, dict[str, Any]]:
        response = await self.core.list_namespaced_resource_quota(
            self.namespace, _preload_content=False
        )
        items = json.loads(await response.read())["items"]
        return {item["metadata"]["name"]: item for item in items}

    async def quota(
        self,
        name: str,
        hard: Mapping[str, str] | Sequence[str],
        *,
        scopes: Sequence[str] = (),
        selector: Sequence[Mapping[str, Any]] = (),
        wait: bool = True,
    ) -> None:
        body = builders.resource_quota(
            name,
            dict(hard) if isinstance(hard, Mapping) else dict.fromkeys(hard, LARGE),
            scopes=scopes,
            scope_selector=selector,
        )
        await self.core.create_namespaced_resource_quota(self.namespace, body)
        if wait:
            await self.filled(name)

    async def patch_hard(self, name: str, hard: Mapping[str, str | None]) -> None:
        await self.core.patch_namespaced_resource_quota(
            name,
            self.namespace,
            {"spec": {"hard": dict(hard)}},
            _content_type="application/merge-patch+json",
        )
        await self.filled(name)

    async def filled(self, name: str) -> None:
        """Wait until the quota's status shows its spec: ``status.hard`` equal to
        ``spec.hard`` and a used value for every name an evaluator measures."""

        def done(quotas: dict[str, dict[str, Any]]) -> bool:
            found = quotas.get(name)
            if found is None:
                return False
            hard = found["spec"].get("hard") or {}
            status = found.get("status") or {}
            return same_list(hard, status.get("hard")) and set(hard) - UNTRACKED <= set(
                status.get("used") or {}
            )

        await eventually(
            self.quotas,
            until=done,
            within=FILL_WITHIN_S,
            what=f"{self.label}: status of quota {self.namespace}/{name} filled",
        )

    async def shows(self, name: str, resource: str, used: str) -> None:
        """Wait until the quota's status shows ``used`` for ``resource``."""

        def done(quotas: dict[str, dict[str, Any]]) -> bool:
            found = (quotas.get(name) or {}).get("status") or {}
            value = (found.get("used") or {}).get(resource)
            return value is not None and parse_quantity(value) == parse_quantity(used)

        await eventually(
            self.quotas,
            until=done,
            within=FILL_WITHIN_S,
            what=f"{self.label}: quota {self.namespace}/{name} shows used {resource}={used}",
        )

    async def root_ca(self) -> None:
        """kube-controller-manager publishes ``kube-root-ca.crt`` into every namespace; wait
        for it, so that configmap counts do not depend on when it lands."""

        async def names() -> set[str]:
            found = await self.core.list_namespaced_config_map(self.namespace)
            return {item.metadata.name for item in found.items}

        await eventually(
            names, until=lambda found: "kube-root-ca.crt" in found, what="kube-root-ca.crt"
        )

    async def pod(
        self,
        name: str,
        requests: Mapping[str, str] | None = None,
        limits: Mapping[str, str] | None = None,
        *,
        hold: bool = False,
        played: bool = False,
        **spec: Any,
    ) -> None:
        """A pod with a finalizer when ``hold``; ``played``: the script writes its status
        itself (:meth:`phase`), so it stays unbound and no kubelet races the script."""
        if hold:
            self.held.append(name)
        body = builders.pod(
            name,
            requests or None,
            limits or None,
            resources="always",
            finalizers=[HOLD_FINALIZER] if hold else None,
            scheduler_name=builders.NO_SCHEDULER if played else None,
            spec=spec,
        )
        await self.core.create_namespaced_pod(self.namespace, body)

    async def delete_pod(self, name: str) -> None:
        await self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)

    async def phase(self, name: str, phase: str) -> None:
        await set_pod_status(self.api, self.namespace, name, phase=phase, ready=False)

    async def release(self) -> None:
        """Drop the finalizers scripts put on pods, so that the namespace can go."""
        for name in self.held:
            with contextlib.suppress(client.ApiException):
                await self.core.patch_namespaced_pod(
                    name,
                    self.namespace,
                    {"metadata": {"finalizers": None}},
                    _content_type="application/merge-patch+json",
                )


def same_list(a: Mapping[str, str] | None, b: Mapping[str, str] | None) -> bool:
    """Two resource lists with the same names and numerically equal values."""
    a, b = a or {}, b or {}
    return set(a) == set(b) and all(parse_quantity(a[k]) == parse_quantity(b[k]) for k in a)


async def settled(side: Side) -> dict[str, dict[str, Any]]:
    """The side's quotas once every status shows its spec and two reads ``STABLE_AFTER_S``
    apart agree."""

    def statuses(quotas: dict[str, dict[str, Any]]) -> dict[str, Any]:
        return {name: q.get("status") for name, q in quotas.items()}

    def synced(quotas: dict[str, dict[str, Any]]) -> bool:
        return all(
            same_list(q["spec"].get("hard"), (q.get("status") or {}).get("hard"))
            for q in quotas.values()
        )

    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_WITHIN_S
    previous = await side.quotas()
    while True:
        await asyncio.sleep(STABLE_AFTER_S)
        current = await side.quotas()
        if synced(current) and statuses(current) == statuses(previous):
            return current
        assert loop.time() < deadline, (
            f"{side.label}: quota statuses in {side.namespace} did not settle within "
            f"{SETTLE_WITHIN_S} s: {statuses(previous)} then {statuses(current)}"
        )
        previous = current


Script = Callable[[Side], Awaitable[None]]


@dataclass(frozen=True)
class Scenario:
    name: str
    script: Script
    anchors: Mapping[str, Mapping[str, str | None]]
    """quota -> name -> the used value both sides must show (None: no used value at all)."""


def compare(scenario: Scenario, upstream: Mapping[str, Any], tally: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    if set(upstream) != set(tally):
        problems.append(f"quotas: upstream {sorted(upstream)}, tally {sorted(tally)}")
    for name in sorted(set(upstream) & set(tally)):
        theirs = upstream[name].get("status") or {}
        ours = tally[name].get("status") or {}
        for part in ("hard", "used"):
            a: dict[str, str] = theirs.get(part) or {}
            b: dict[str, str] = ours.get(part) or {}
            for key in sorted(set(a) | set(b)):
                if key not in a or key not in b or parse_quantity(a[key]) != parse_quantity(b[key]):
                    problems.append(
                        f"{name}: status.{part}[{key}]: upstream {a.get(key)}, tally {b.get(key)}"
                    )
    return problems


def check_anchors(scenario: Scenario, label: str, quotas: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    for name, expected in scenario.anchors.items():
        used = ((quotas.get(name) or {}).get("status") or {}).get("used") or {}
        for key, value in expected.items():
            got = used.get(key)
            ok = got is None if value is None else (
                got is not None and parse_quantity(got) == parse_quantity(value)
            )  # fmt: skip
            if not ok:
                problems.append(f"{label}: {name}: used[{key}] is {got}, expected {value}")
    return problems
