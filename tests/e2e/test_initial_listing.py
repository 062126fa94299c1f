"""Kopf's initial listing longer than etcd's compaction, and an API server that does not stream
a watch's initial state.

Kopf lists each kind before watching it, as fast as its events are handled: a large cluster's
pods take minutes. Paged (``limit`` and ``continue``), a listing is refused with 410 Gone once
its continue token is older than etcd's last compaction (kube-apiserver compacts every 5
minutes by default); Kopf does not retry that, and a watcher's failure stops the whole
operator, at every restart alike. Where the API server streams a watch's initial state
(``sendInitialEvents``, the WatchList feature) tally has Kopf use that, which has no token to
expire; where it does not (the feature off, as Kubernetes 1.33 ships it), Kopf pages as before
and tally says what that risks.

Each test has a plane of its own, with kwok nodes like every other; two of each test's
configmaps hold just under 1 MiB (a streamed listing carries each in one line):

* compaction every second (``--etcd-compaction-interval=1s``), with writes elsewhere moving
  etcd's revision on: a continue token then lives about ten seconds (measured on such a plane:
  8 s after the first page it was still served, 12 s after refused), less than Kopf's listing
  of 20 000 configmaps takes in tally, as a large cluster's listing outlasts five minutes.
  tally stays up, counts every configmap, and a configmap created after its start is counted
  (with Kopf paging, tally exits with the 410 before it is ready);
* WatchList off (``--feature-gates=WatchList=false``): the API server refuses
  ``sendInitialEvents`` (422), which Kopf would not survive either; tally asks first, lists in
  pages, says why, and counts as everywhere.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Final

from kubernetes_asyncio import client
from operator_process import TallyProcess

from tally.app.handlers import INITIAL_PAGED, INITIAL_STREAMED
from tally.app.kopf_settings import LISTING_PAGE
from tally_e2e import (
    ControlPlane,
    eventually,
    plane_api,
    plane_of_its_own,
    wait_for_root_ca_configmap,
)

CONFIGMAPS: Final = 20000
"""Forty of Kopf's pages: longer to list in tally than a continue token lives on that plane."""
CREATES_IN_FLIGHT: Final = 32
READY_WITHIN_S: Final = 120.0
"""tally's readiness waits for the start-up re-list (~30 s after its LISTs), which comes after
Kopf's listings; generous beside it."""
QUOTA: Final = "listing"
BIG: Final = 2
"""Of the configmaps, those holding just under the API server's 1 MiB limit: a streamed
listing carries each whole in one line."""
BIG_DATA: Final = 1_000_000


async def _populate(api: client.ApiClient, namespace: str, count: int) -> None:
    """The namespace, its ``kube-root-ca.crt``, ``count`` configmaps (the first ``BIG`` of them
    near 1 MiB) and a quota counting them (its status empty: no quota system runs yet)."""
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": namespace}})
    await wait_for_root_ca_configmap(api, namespace)
    slots = asyncio.Semaphore(CREATES_IN_FLIGHT)

    async def create(index: int) -> None:
        data = {"index": str(index)}
        if index < BIG:
            data["filler"] = "x" * BIG_DATA
        async with slots:
            await core.create_namespaced_config_map(
                namespace, {"metadata": {"name": f"map-{index}"}, "data": data}
            )

    await asyncio.gather(*(create(index) for index in range(count)))
    await core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": QUOTA}, "spec": {"hard": {"configmaps": "100000"}}}
    )


async def _used_configmaps(api: client.ApiClient, namespace: str) -> str | None:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota(QUOTA, namespace)
    return ((quota.status and quota.status.used) or {}).get("configmaps")


async def _churn(api: client.ApiClient, stop: asyncio.Event) -> int:
    """Writes elsewhere, ten a second, so that each compaction moves past the listing's
    revision (tally's and the control plane's own writes do too, less regularly)."""
    core = client.CoreV1Api(api)
    name = f"churn-{uuid.uuid4().hex[:6]}"
    await core.create_namespaced_config_map("default", {"metadata": {"name": name}})
    writes = 0
    try:
        while not stop.is_set():
            writes += 1
            await core.patch_namespaced_config_map(
                name, "default", {"data": {"writes": str(writes)}}
            )
            await asyncio.sleep(0.1)
    finally:
        await core.delete_namespaced_config_map(name, "default")
    return writes


async def _start_and_count(plane: ControlPlane, tmp_path: Path, count: int) -> str:
    """Populate ``count`` configmaps, start tally with writes going on, and check that it
    stays up, becomes ready, counts them, and counts one created after; its log."""
    namespace = f"listing-{uuid.uuid4().hex[:6]}"
    tally = TallyProcess(plane.kubeconfig, tmp_path / "tally.log", bin_dir=plane.bin_dir)
    async with plane_api(plane) as api:
        await _populate(api, namespace, count)
        stop = asyncio.Event()
        churning = asyncio.create_task(_churn(api, stop))
        try:
            await asyncio.to_thread(tally.start)
            deadline = time.monotonic() + READY_WITHIN_S
            while not tally.ready():
                assert tally.running, f"tally exited:\n{tally.log_text(tail=40)}"
                assert time.monotonic() < deadline, (
                    f"not ready within {READY_WITHIN_S:.0f} s:\n{tally.log_text()}"
                )
                await asyncio.sleep(0.5)
            # Every map, the root CA's included, from tally's LIST and Kopf's listing alike.
            await eventually(
                lambda: _used_configmaps(api, namespace),
                until=lambda used: used == str(count + 1),
                what=f"configmaps {count + 1} in the quota's status",
            )
            # One more, through the watch that follows Kopf's listing.
            await client.CoreV1Api(api).create_namespaced_config_map(
                namespace, {"metadata": {"name": "after-the-start"}}
            )
            await eventually(
                lambda: _used_configmaps(api, namespace),
                until=lambda used: used == str(count + 2),
                what=f"configmaps {count + 2} in the quota's status",
            )
            assert tally.running, tally.log_text(tail=40)
            return tally.log_text(tail=100_000)
        finally:
            stop.set()
            writes = await churning
            print(f"{writes} writes beside the start")
            tally.kill()


def test_a_listing_longer_than_compaction_leaves_tally_up(tmp_path: Path) -> None:
    with plane_of_its_own(tmp_path / "plane", "--etcd-compaction-interval=1s") as plane:
        log = asyncio.run(_start_and_count(plane, tmp_path, CONFIGMAPS))
    assert INITIAL_STREAMED in log
    assert "has failed" not in log


def test_without_watch_list_kopf_pages_and_tally_says_so(tmp_path: Path) -> None:
    with plane_of_its_own(tmp_path / "plane", "--feature-gates=WatchList=false") as plane:
        log = asyncio.run(_start_and_count(plane, tmp_path, 200))
    assert INITIAL_PAGED % LISTING_PAGE in log
    assert INITIAL_STREAMED not in log
    assert "has failed" not in log
