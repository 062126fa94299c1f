"""PodSet expectations hold when tally's view of pods lags, and across a crash.

tally runs here as a process of the test's own (``operator_process.TallyProcess``) against the
session's operator-mode control plane, so the test can freeze and kill it, and with its PodSet
controller's pod events delayed (``lagging_operator.py``, ``EVENT_DELAY_S``): its
cache of pods lags the API by that much, so every sync right after a create or a scale sees too
few pods, and only the expectations keep it from creating more (without them, the first test
fails: checked by disabling them). A watch in the test
(``podset_e2e.OwnedPodWatch``) sees every change of the PodSet's pods and checks each against
the bound the test sets, so a transient extra pod between two polls cannot go unseen.

* **Stalled event stream**: tally is frozen (SIGSTOP) and thawed (SIGCONT) again and again while
  it scales a PodSet up, and the spec is raised and lowered while it is frozen. A frozen tally
  reads nothing: on thawing, the responses to its creates and the watch events for them arrive
  in one backlog, in any order, with syncs already queued. The count must never exceed
  ``spec.replicas`` during a scale-up (nor fall below it during a scale-down), and end exact.
* **Crash**: tally is killed (SIGKILL) during 0 → 50 and started again; the restarted process
  knows nothing of the dead one's expectations and must count from its LIST: exactly 50 pods,
  never more.

Scaling goes through the scale subresource (as ``kubectl scale`` does), which tally's PodSet
validation webhook does not see: a frozen tally could not answer it. Freezes stay well under
the webhook's 10 s timeout: tally is its own quota webhook, so a pod create it sent just before
freezing is admitted after the thaw rather than refused.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubernetes_asyncio import client
from operator_process import WEBHOOK_CONFIGURATION, TallyProcess
from podset_e2e import PODSET, OwnedPodWatch, install_podset_crd

from tally_e2e import ControlPlane, eventually

FILL_WITHIN_S = 120.0
"""From the last thaw or restart to the full count; generous for a shared 2-core machine."""
STABLE_FOR_S = 5.0
"""After reaching the count, it must stay exact this long (a late extra create would show)."""
EVENT_DELAY_S = 1.0
"""Longer than a slow-start round of creates on this machine, so syncs run on a stale cache."""
FREEZES = (0.3, 1.0, 2.0, 0.5, 3.0, 1.5)


@pytest.fixture(scope="module")
def tally(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TallyProcess]:
    install_podset_crd(control_plane)
    process = TallyProcess(
        control_plane.kubeconfig,
        tmp_path_factory.mktemp("tally-robustness") / "tally.log",
        bin_dir=control_plane.bin_dir,
        env={"TALLY_E2E_POD_EVENT_DELAY": str(EVENT_DELAY_S)},
        entry_point=Path(__file__).with_name("lagging_operator.py"),
    )
    process.start()
    try:
        yield process
    finally:
        process.kill()
        # A SIGKILLed tally leaves its fail-closed webhook configuration behind; a graceful
        # stop removes it. Whatever happened, leave none for the next module.
        if process.webhook_registered():
            control_plane.kubectl(
                "delete", WEBHOOK_CONFIGURATION, "--ignore-not-found", check=False
            )


@pytest_asyncio.fixture
async def pods_watch(api: client.ApiClient, namespace: str) -> AsyncIterator[OwnedPodWatch]:
    watcher = OwnedPodWatch(api, namespace, PODSET, "web")
    await watcher.start()
    yield watcher
    await watcher.stop()


def freeze(tally: TallyProcess) -> None:
    assert tally.process is not None
    tally.process.send_signal(signal.SIGSTOP)


def thaw(tally: TallyProcess) -> None:
    assert tally.process is not None
    tally.process.send_signal(signal.SIGCONT)


async def status_replicas(api: client.ApiClient, namespace: str, want: int) -> None:
    await eventually(
        lambda: PODSET.get(api, namespace, "web"),
        until=lambda o: (
            (o.get("status") or {}).get("replicas", 0) == want
            and (o.get("status") or {}).get("observedGeneration") == o["metadata"]["generation"]
        ),
        within=FILL_WITHIN_S,
        what=f"status.replicas {want}",
    )


async def test_never_more_pods_than_replicas_while_tally_is_frozen_and_thawed(
    tally: TallyProcess, api: client.ApiClient, namespace: str, pods_watch: OwnedPodWatch
) -> None:
    await PODSET.create(api, namespace, "web", 0)
    await status_replicas(api, namespace, 0)

    # Scale-up with freezes mid-flight: from the first create on, freeze and thaw repeatedly.
    pods_watch.ceiling = 60
    try:
        await PODSET.scale(api, namespace, "web", 60, subresource=True)
        await eventually(
            lambda: asyncio.sleep(0.02, pods_watch.count),
            until=lambda n: n >= 1,
            within=30,
            interval=0.0,
            what="the first pod",
        )
        for pause in FREEZES:
            freeze(tally)
            await asyncio.sleep(pause)
            thaw(tally)
            await asyncio.sleep(0.3)

        # Raised while frozen: tally wakes to a new spec, a backlog of pod events and the
        # answers to its own creates, all at once.
        freeze(tally)
        pods_watch.ceiling = 90
        await PODSET.scale(api, namespace, "web", 90, subresource=True)
        await asyncio.sleep(1.0)
    finally:
        thaw(tally)
    await pods_watch.until(90, within=FILL_WITHIN_S)
    await pods_watch.stable(90, STABLE_FOR_S)

    # Lowered while frozen, then frozen again mid-deletion: never below the new spec.
    freeze(tally)
    try:
        await PODSET.scale(api, namespace, "web", 30, subresource=True)
        pods_watch.floor = 30
        await asyncio.sleep(1.0)
        thaw(tally)
        await asyncio.sleep(0.2)
        freeze(tally)
        await asyncio.sleep(2.0)
    finally:
        thaw(tally)
    await pods_watch.until(30, within=FILL_WITHIN_S)
    pods_watch.ceiling = 30
    await pods_watch.stable(30, STABLE_FOR_S)
    await status_replicas(api, namespace, 30)

    assert pods_watch.violations == []
    assert pods_watch.max_seen == 90


async def test_a_killed_and_restarted_tally_ends_at_exactly_spec_replicas(
    tally: TallyProcess, api: client.ApiClient, namespace: str, pods_watch: OwnedPodWatch
) -> None:
    await PODSET.create(api, namespace, "web", 0)
    await status_replicas(api, namespace, 0)
    pods_watch.ceiling = 50
    await PODSET.scale(api, namespace, "web", 50, subresource=True)
    await eventually(
        lambda: asyncio.sleep(0.01, pods_watch.count),
        until=lambda n: n >= 3,
        within=30,
        interval=0.0,
        what="a few pods before the kill",
    )
    assert tally.process is not None
    tally.process.kill()  # SIGKILL: no cleanup, expectations lost, webhook left registered
    tally.process.wait()
    at_kill = pods_watch.count
    assert at_kill < 50, "tally finished the scale-up before it was killed: nothing tested"
    tally.start()  # re-registers the same webhook configuration with its new address
    await pods_watch.until(50, within=FILL_WITHIN_S)
    await pods_watch.stable(50, STABLE_FOR_S)
    await status_replicas(api, namespace, 50)
    assert pods_watch.violations == []
    assert pods_watch.max_seen == 50
