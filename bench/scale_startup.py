"""What ``bench/scale.py`` measures beside convergence: creates answered while the quota system
starts, and one ClusterQuota over every namespace.

* :class:`CreateProbe`: configmap creates at a fixed rate (open loop: each is sent on time,
  whatever the answers to earlier ones) into a namespace of its own whose quota counts
  ``count/configmaps``, so each create is judged and charged. Every answer's latency and status
  is kept with the moment it was sent; :func:`window` sums up a span of them.
* The ClusterQuota: one, selecting every namespace the benchmark populated (by a label they are
  created with), with the per-namespace quota's resource names; :func:`cluster_quota_correct`
  tells whether its ``status.total.used`` equals the sums of what every namespace's quota must
  show.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any, Final

from kubernetes_asyncio import client

from _common import Raw, percentile
from tally.quota.quantity import Quantity, parse_quantity

PROBE_NAMESPACE: Final = "scale-probe"
PROBE_QUOTA: Final = "probe"
PROBE_RATE: Final = 10.0
"""Creates per second: far below what either side sustains on this machine when quiet (hundreds
a second), so what the latencies show is the start-up's cost, not the probe's load."""
PROBE_TIMEOUT_S: Final = 30.0
MEMBER_LABEL: Final = "scale.tally.dev/member"
CLUSTER_QUOTA: Final = "scale-all"
CLUSTER_QUOTAS_PATH: Final = "/apis/tally.dev/v1alpha1/clusterquotas"


@dataclasses.dataclass(frozen=True)
class Create:
    sent_s: float
    """When it was sent, seconds since the side's clock started (tally's spawn, upstream's first
    quota create)."""
    seconds: float
    status: int
    """The HTTP status; 0 when no answer came (a timeout, a reset connection)."""


class CreateProbe:
    """Open-loop configmap creates into :data:`PROBE_NAMESPACE`; :meth:`run` until stopped."""

    def __init__(self, raw: Raw, rate: float = PROBE_RATE) -> None:
        self.raw = raw
        self.rate = rate
        self.creates: list[Create] = []
        self._sent = 0

    async def prepare(self, *, write_status: bool) -> None:
        """The namespace and its quota. ``write_status``: write the quota's status as a quota
        system that ran before would have left it (the plane has none running: tally starts
        later), so that tally's admission judges the probe's creates from its first review, as
        upstream's does once its controller has computed the quota."""
        await self.raw.create("/api/v1/namespaces", {"metadata": {"name": PROBE_NAMESPACE}})
        path = f"/api/v1/namespaces/{PROBE_NAMESPACE}/resourcequotas"
        hard = {"count/configmaps": "1M"}
        await self.raw.create(path, {"metadata": {"name": PROBE_QUOTA}, "spec": {"hard": hard}})
        quota_path = f"{path}/{PROBE_QUOTA}"
        deadline = time.monotonic() + 120.0
        while True:
            quota = await self.raw.call("GET", quota_path)
            used = (quota.get("status") or {}).get("used") or {}
            if "count/configmaps" in used:
                return
            if write_status:
                configmaps = await self.raw.list_all(
                    f"/api/v1/namespaces/{PROBE_NAMESPACE}/configmaps"
                )
                quota["status"] = {"hard": hard, "used": {"count/configmaps": str(len(configmaps))}}
                with contextlib.suppress(client.ApiException):  # a conflict: read it again
                    await self.raw.call("PUT", f"{quota_path}/status", quota)
            if time.monotonic() > deadline:
                raise RuntimeError("the probe namespace's quota never had a status")
            await asyncio.sleep(0.5)

    async def run(self, started: float, stop: asyncio.Event) -> None:
        """Send one create every 1/rate s from now until ``stop`` is set; times are kept
        relative to ``started`` (perf_counter). Returns once every sent create is answered."""
        in_flight: set[asyncio.Task[None]] = set()
        next_at = time.perf_counter()
        while not stop.is_set():
            delay = next_at - time.perf_counter()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
            task = asyncio.create_task(self._one(started))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            next_at += 1.0 / self.rate
        if in_flight:
            await asyncio.wait(in_flight)

    async def _one(self, started: float) -> None:
        self._sent += 1
        name = f"probe-{self._sent:06d}"
        body = {"metadata": {"name": name}, "data": {"key": "value"}}
        sent = time.perf_counter()
        status = 201
        try:
            await self.raw.call(
                "POST",
                f"/api/v1/namespaces/{PROBE_NAMESPACE}/configmaps",
                body,
                request_timeout=PROBE_TIMEOUT_S,
            )
        except client.ApiException as error:
            status = int(error.status or 0)
        except (OSError, TimeoutError):
            status = 0
        self.creates.append(Create(sent - started, time.perf_counter() - sent, status))


@dataclasses.dataclass(frozen=True)
class Window:
    """Creates sent within one span, summed up."""

    begin_s: float
    end_s: float
    creates: int
    failed: int
    """Answered other than 201 Created (or not answered)."""
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None


def window(creates: list[Create], begin_s: float, end_s: float) -> Window:
    inside = [c for c in creates if begin_s <= c.sent_s < end_s]
    latencies = [c.seconds * 1000 for c in inside]
    return Window(
        begin_s,
        end_s,
        len(inside),
        sum(1 for c in inside if c.status != 201),
        percentile(latencies, 0.50) if latencies else None,
        percentile(latencies, 0.99) if latencies else None,
        max(latencies) if latencies else None,
    )


def cluster_quota_body(hard: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "ClusterQuota",
        "metadata": {"name": CLUSTER_QUOTA},
        "spec": {
            "namespaceSelector": {"matchLabels": {MEMBER_LABEL: "true"}},
            "quota": {"hard": hard},
        },
    }


def cluster_totals(expected: dict[str, dict[str, Quantity]]) -> dict[str, Quantity]:
    """What the ClusterQuota's ``status.total.used`` must show: every namespace's sums."""
    totals: dict[str, Quantity] = {}
    for used in expected.values():
        for name, value in used.items():
            totals[name] = totals[name] + value if name in totals else value
    return totals


def cluster_quota_correct(cluster_quota: dict[str, Any], totals: dict[str, Quantity]) -> bool:
    used = ((cluster_quota.get("status") or {}).get("total") or {}).get("used") or {}
    for name, value in totals.items():
        text = used.get(name)
        try:
            if text is None or parse_quantity(text) != value:
                return False
        except ValueError:
            return False
    return True
