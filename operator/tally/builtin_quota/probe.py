"""The start-up probe for the cluster's own quota system: a probe quota, watched and dry-run.

:mod:`tally.builtin_quota.decision` says what the observations mean and what tally does; this module
makes them, in a namespace tally's webhook exempts (``TALLY_NAMESPACE``, else ``kube-system``),
so that no tally webhook — an earlier run's left registered, dead or alive — stands between
the probe and the built-in plugin:

1. Make room, then create the probe (``spec.hard: {resourcequotas: "0"}``). A probe quota
   already there is another tally's probe in progress (replicas starting together) or the
   leftover of a start killed mid-probe: it is left alone for :data:`LEFTOVER_WAIT_S`, and
   deleted (UID precondition) only if it is still there then. A create that finds one created
   meanwhile (409) makes room again.
2. Write its status at once, ``hard: {resourcequotas: "0"}, used: {resourcequotas: "0"}``, as
   tally (field manager ``tally``). The admission plugin enforces only a quota whose
   ``status.hard`` is set, and this write makes that true even when the controller is off.
   ``used`` is deliberately 0 although the probe itself counts 1: upstream's controller writes
   only when its computed usage differs from the status, so a running controller is bound to
   overwrite it — which is how it shows itself.
3. Read the probe until a writer other than tally shows up in the status's managedFields
   (upstream's controller: 4 to 60 ms on the local control plane) or
   :data:`CONTROLLER_WAIT_S` pass.
4. Dry-run create another ResourceQuota there: refused with ``exceeded quota: …`` means the
   admission plugin is on. "Admitted" counts only once the status has been set for
   :data:`SETTLE_S` (the plugin reads quotas from its informer, which may lag the write by a
   moment); an earlier admission is retried.
5. Delete the probe (UID precondition), whatever happened.

Everything is bounded by :data:`TIMEOUT_S`; an answer the probe cannot read (403 from RBAC, a
webhook failing, no answer) leaves that part *unknown* rather than raising. In operator mode the
cost is :data:`CONTROLLER_WAIT_S` plus a handful of requests, and the runtime runs the probe
concurrently with its cache sync.

What it cannot see: a controller slower than :data:`CONTROLLER_WAIT_S` to fill a new quota's
status (a kube-controller-manager throttled for seconds), and the plugin on an API server whose
informer lags by more than :data:`SETTLE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client

from tally.builtin_quota.decision import (
    DRY_RUN_NAME,
    PROBE_LABELS,
    PROBE_NAME,
    PROBE_RESOURCE,
    Action,
    Decision,
    Finding,
    ProbeResult,
    State,
    admission_finding,
    controller_finding,
    decide,
    foreign_status_writers,
    has_status_hard,
    probe_namespace,
)
from tally.kube import rest

logger = logging.getLogger(__name__)

CONTROLLER_WAIT_S: Final = 0.5
"""How long the probe waits for someone else to write the probe quota's status. Upstream's
controller wrote it within 4 to 60 ms on the local control plane (the 60 when it lost the race
with tally's own status write and retried); the log line of every start says how long it took.
A new quota goes to the controller's "missing usage" queue, ahead of resyncs, and the write
needs one request of its client, so 0.5 s leaves a wide margin for a loaded
kube-controller-manager. It is also the probe's whole cost when the built-in system is off:
start-up waits for it unless the cache sync takes longer (which it does on a cluster of any
size), so it is kept well under a second."""
SETTLE_S: Final = 0.25
"""How long the probe's ``status.hard`` must have been set before an admitted dry run counts as
"plugin off" (the plugin judges against its informer's copy, normally milliseconds behind)."""
LEFTOVER_WAIT_S: Final = 3.0
"""How long a probe quota found at start may be another tally's probe in progress before it
counts as a leftover and is deleted. A probe takes under a second (:data:`CONTROLLER_WAIT_S`,
:data:`SETTLE_S` and a few requests); deleting another replica's probe mid-run would leave
that replica unable to tell. Only a real leftover (a killed start) costs this wait."""
POLL_S: Final = 0.05
TIMEOUT_S: Final = 10.0
"""The bound on the whole probe, cleanup aside: a probe that hangs must not hang start-up."""
REQUEST_TIMEOUT_S: Final = 5.0


@dataclass(frozen=True)
class _Answer:
    """One API answer: ``status`` 0 means none came (connection error, client timeout)."""

    status: int
    body: dict[str, Any]
    message: str

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


async def probe(
    api: client.ApiClient,
    namespace: str,
    *,
    controller_wait: float = CONTROLLER_WAIT_S,
    bound: float = TIMEOUT_S,
) -> ProbeResult:
    """Run the probe in ``namespace``; never raises for what the API answers (see above)."""
    run = _Probe(api, namespace, controller_wait)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async with asyncio.timeout(bound):
            await run.run()
    except TimeoutError:
        run.give_up(f"the probe did not finish within {bound:g} s")
    finally:
        await run.cleanup()
    return run.result(loop.time() - started)


class _Probe:
    def __init__(self, api: client.ApiClient, namespace: str, controller_wait: float) -> None:
        self._api = api
        self.namespace = namespace
        self._controller_wait = controller_wait
        self._loop = asyncio.get_running_loop()
        self._path = rest.collection_path("", "v1", PROBE_RESOURCE, namespace)
        self.uid = ""
        self.admission: Finding | None = None
        self.controller: Finding | None = None
        self._created_at = 0.0
        self._status_set_at: float | None = None
        self._own_status_error = ""

    def give_up(self, why: str) -> None:
        """Whatever is not concluded yet stays unknown, for ``why``."""
        self.admission = self.admission or Finding(State.UNKNOWN, why)
        self.controller = self.controller or Finding(State.UNKNOWN, why)

    def result(self, elapsed: float) -> ProbeResult:
        unfinished = Finding(State.UNKNOWN, "the probe stopped early")
        return ProbeResult(
            self.namespace,
            self.admission or unfinished,
            self.controller or unfinished,
            elapsed,
        )

    async def run(self) -> None:
        while True:
            await self._make_room()
            created = await self._create()
            if created is not None:
                break
        if not created:
            return
        await self._watch_status()
        await self._dry_run()

    async def _make_room(self) -> None:
        """Step 1: wait for another start's probe to go, delete a leftover (module doc)."""
        path = f"{self._path}/{PROBE_NAME}"
        seen: tuple[str, float] | None = None  # (uid, first seen)
        while True:
            answer = await self._request("GET", path)
            if answer.status == 404:
                return
            if not answer.ok:
                # Cannot look (no get permission, an error): delete whatever is there, as
                # before replicas probed side by side; a failure shows up at the create.
                await self._request("DELETE", path)
                return
            uid = str(answer.body.get("metadata", {}).get("uid") or "")
            now = self._loop.time()
            if seen is None or seen[0] != uid:
                seen = (uid, now)
            elif now - seen[1] >= LEFTOVER_WAIT_S:
                logger.info("deleting a leftover built-in quota probe %s/%s (uid %s)",
                            self.namespace, PROBE_NAME, uid)  # fmt: skip
                await self._request("DELETE", path, body={"preconditions": {"uid": uid}})
                return
            await asyncio.sleep(2 * POLL_S)

    async def _create(self) -> bool | None:
        """Create the probe and set its status; False: no probe (findings set); None: another
        start's probe was created meanwhile (make room again)."""
        answer = await self._request(
            "POST",
            self._path,
            body=_probe_quota(PROBE_NAME, {PROBE_RESOURCE: "0"}),
        )
        if answer.status == 409:
            return None
        if not answer.ok:
            finding = admission_finding(
                answer.status, answer.message, what="creating the probe quota"
            )
            # Refused by the plugin itself (a quota already in the namespace limits quotas):
            # that is the plugin seen on. Anything else leaves both parts unknown.
            self.admission = finding
            self.controller = Finding(State.UNKNOWN, f"no probe quota to watch: {finding.detail}")
            return False
        self._created_at = self._loop.time()
        self.uid = str(answer.body.get("metadata", {}).get("uid") or "")
        written = await self._request(
            "PUT",
            f"{self._path}/{PROBE_NAME}/status",
            body={
                **answer.body,
                "status": {"hard": {PROBE_RESOURCE: "0"}, "used": {PROBE_RESOURCE: "0"}},
            },
        )
        if written.ok:
            self._status_set_at = self._loop.time()
        elif written.status != 409:  # 409: someone wrote first (step 3 sees who)
            self._own_status_error = f"HTTP {written.status} {written.message}"
        return True

    async def _watch_status(self) -> None:
        deadline = self._created_at + self._controller_wait
        writers: frozenset[str] = frozenset()
        observed = False
        error = ""
        while True:
            answer = await self._request("GET", f"{self._path}/{PROBE_NAME}")
            now = self._loop.time()
            if answer.ok:
                observed = True
                if self._status_set_at is None and has_status_hard(answer.body):
                    self._status_set_at = now
                writers = foreign_status_writers(answer.body, rest.FIELD_MANAGER)
            else:
                error = f"HTTP {answer.status} {answer.message}"
            if writers or now >= deadline:
                break
            await asyncio.sleep(min(POLL_S, max(deadline - now, 0.0)))
        self.controller = controller_finding(
            writers, now - self._created_at, observed=observed, error=error
        )

    async def _dry_run(self) -> None:
        if self._status_set_at is None:
            why = self._own_status_error or "nobody wrote it"
            self.admission = Finding(
                State.UNKNOWN,
                f"the probe quota never got a status.hard ({why}), and the plugin enforces "
                "only quotas that have one",
            )
            return
        what = "a dry-run create of a ResourceQuota"
        while True:
            answer = await self._request(
                "POST",
                self._path,
                body=_probe_quota(DRY_RUN_NAME, {}),
                dry_run=True,
            )
            finding = admission_finding(answer.status, answer.message, what=what)
            settled_at = self._status_set_at + SETTLE_S
            now = self._loop.time()
            if finding.state is not State.OFF or now >= settled_at:
                self.admission = finding
                return
            await asyncio.sleep(settled_at - now)

    async def cleanup(self) -> None:
        """Delete the probe quota this run created (only that one: UID precondition)."""
        if not self.uid:
            return
        answer = await self._request(
            "DELETE",
            f"{self._path}/{PROBE_NAME}",
            body={"preconditions": {"uid": self.uid}},
        )
        # 404: gone already; 409: a different object of that name (not ours to delete).
        if not answer.ok and answer.status not in (404, 409):
            logger.warning(
                "could not delete the built-in quota probe %s/%s (HTTP %s %s); delete it by "
                "hand: kubectl -n %s delete resourcequota %s",
                self.namespace, PROBE_NAME, answer.status, answer.message,
                self.namespace, PROBE_NAME,
            )  # fmt: skip

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        dry_run: bool = False,
    ) -> _Answer:
        """One request; every failure comes back as an answer, never as an exception."""
        query = [("fieldManager", rest.FIELD_MANAGER)] if method in ("POST", "PUT") else []
        if dry_run:
            query.append(("dryRun", "All"))
        try:
            data, status, _ = await self._api.call_api(
                path,
                method,
                query_params=query,
                body=body,
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                response_types_map={200: "object", 201: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except client.ApiException as error:
            return _Answer(int(error.status or 0), {}, _status_message(error))
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            return _Answer(0, {}, f"no answer: {error!r}")
        return _Answer(int(status), data if isinstance(data, dict) else {}, "")


def _status_message(error: client.ApiException) -> str:
    """The Status message of a refusal (the JSON body), else the HTTP reason."""
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = json.loads(error.body or "{}").get("message")
        if message:
            return str(message)
    return str(error.reason or "")


def _probe_quota(name: str, hard: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "labels": PROBE_LABELS},
        "spec": {"hard": hard},
    }


async def check(api: client.ApiClient, namespace: str, *, allowed: bool) -> Decision:
    """Probe (in ``namespace``, or the default probe namespace), decide whether tally enforces
    ResourceQuotas here, and say so in the log (a warning when both quota systems run)."""
    result = await probe(api, probe_namespace(namespace))
    decision = decide(result, allowed=allowed)
    if decision.action is Action.WARN:
        logger.warning("%s", decision.message)
    else:
        logger.info("%s", decision.message)
    return decision
