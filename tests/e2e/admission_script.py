"""A small language for scripted admission requests, run the same way on both control planes.

A :data:`Script` is a list of steps. Each step is a coroutine taking a :class:`Context` (an API
client and a namespace on one control plane) and returning either ``None`` (setup: creating a
quota, waiting for its status, deleting objects; a setup step that fails raises, which fails the
test) or an outcome string to be compared across control planes:

* ``allowed``;
* ``denied <code>: <message>`` where ``<message>`` is the part an API server's error shares in
  both modes: after ``admission webhook "quota.tally.dev" denied the request: `` (operator mode)
  or after ``<resource>[ "<name>"] is forbidden: `` (reference mode; a create with only a
  generated name has no ``"<name>"``). Other errors (validation) are kept whole. The namespace's
  random name is replaced by ``<ns>``;
* ``used {name=value,...}``: a quota's ``status.used``, values written as plain numbers (whole
  units, or ``m``/``n`` suffixed when fractional) so that two spellings of one quantity
  (``1000Mi`` and ``1048576000``) compare equal; upstream's controller may write either.

Nothing here is expected by tally: the same steps run against reference mode (upstream's
admission plugin and controller), and the test compares the two lists of outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes_asyncio import client

import builders
from tally.quota.quantity import parse_quantity

WEBHOOK_PREFIX: Final = 'admission webhook "quota.tally.dev" denied the request: '
# `pods "x" is forbidden: …`, `persistentvolumeclaims "x" is forbidden: …`, and for a create
# with only a generateName `secrets is forbidden: …` (apierrors.NewForbidden with name "").
FORBIDDEN_PREFIX: Final = re.compile(r'^[a-z0-9.-]+(?: "[^"]*")? is forbidden: ', re.DOTALL)
NANO: Final = 10**9
# Upstream's controller fills a new quota within a second or two; generous for a loaded host.
SETTLE_WITHIN_S: Final = 30.0
# After a quota's status is seen through the API, give the admission side's informer (the API
# server's own, or tally's) a moment to see the same version.
CACHE_GRACE_S: Final = 0.3
PROBE_WITHIN_S: Final = 15.0
# Both controllers compute usage from their informers. A recalculation triggered right after a
# create can run before the informer has the new object and write a usage that misses it, which
# stays until the next trigger (upstream's known race, tally's too). Before a step that triggers
# a recalculation (a new quota, a spec change), give the informers this long to catch up.
INFORMER_GRACE_S: Final = 1.0

KIND_METHODS: Final = {
    "pods": "pod",
    "services": "service",
    "persistentvolumeclaims": "persistent_volume_claim",
    "configmaps": "config_map",
    "secrets": "secret",
    "resourcequotas": "resource_quota",
}
MERGE_PATCH: Final = "application/merge-patch+json"


@dataclass
class Context:
    """One run of a script: one control plane, one namespace."""

    api: client.ApiClient
    namespace: str
    mode: str
    #: Cluster-scoped objects to delete after the run: (kind, name).
    cluster_objects: list[tuple[str, str]] = field(default_factory=list)
    #: Observations for the report that are not compared (e.g. which of two quotas upstream
    #: named when both failed).
    notes: list[str] = field(default_factory=list)

    def cluster_name(self, suffix: str) -> str:
        """A cluster-scoped name unique to this run (the namespace is random)."""
        return f"{self.namespace}-{suffix}"

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)


Outcome = str | None
Step = Callable[[Context], Awaitable[Outcome]]


@dataclass(frozen=True)
class Labeled:
    """A step and the label its outcome is recorded under."""

    label: str
    step: Step


Script = list[Labeled]


# -- outcomes ---------------------------------------------------------------------------------


def message_part(message: str, namespace: str) -> str:
    """The part of an API error message both modes share (see the module docstring)."""
    if message.startswith(WEBHOOK_PREFIX):
        message = message[len(WEBHOOK_PREFIX) :]
    else:
        message = FORBIDDEN_PREFIX.sub("", message, count=1)
    return message.replace(namespace, "<ns>")


def plain_quantity(text: str) -> str:
    """A quantity as a plain number, the same for every spelling of one value."""
    nanos = parse_quantity(text).nanos
    if nanos % NANO == 0:
        return str(nanos // NANO)
    if nanos % 10**6 == 0:
        return f"{nanos // 10**6}m"
    return f"{nanos}n"


def describe_used(used: Mapping[str, str]) -> str:
    return "used {" + ",".join(f"{k}={plain_quantity(v)}" for k, v in sorted(used.items())) + "}"


@dataclass(frozen=True)
class Response:
    status: int
    body: dict[str, Any]

    def outcome(self, namespace: str) -> str:
        if 200 <= self.status < 300:
            return "allowed"
        message = str(self.body.get("message", self.body))
        return f"denied {self.status}: {message_part(message, namespace)}"


async def call(ctx: Context, verb: str, kind: str, *args: Any, **kwargs: Any) -> Response:
    """``CoreV1Api.<verb>_namespaced_<kind>(*args, ctx.namespace, ...)`` returning the raw
    status and JSON body; API errors are returned, not raised."""
    method = getattr(ctx.core, f"{verb}_namespaced_{KIND_METHODS[kind]}")
    if verb == "create":
        response = await method(ctx.namespace, *args, _preload_content=False, **kwargs)
    else:
        response = await method(*args[:1], ctx.namespace, *args[1:], _preload_content=False,
                                **kwargs)  # fmt: skip
    try:
        raw = await response.read()
    finally:
        response.release()
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {"message": raw.decode(errors="replace")}
    return Response(response.status, body if isinstance(body, dict) else {"message": str(body)})


def require(response: Response, what: str) -> Response:
    if not 200 <= response.status < 300:
        raise AssertionError(f"setup step failed: {what}: {response.status} {response.body}")
    return response


# -- objects ----------------------------------------------------------------------------------


# The scripts' pods and containers (builders.py) always carry ``resources``, ``{}`` when empty.
container = functools.partial(builders.container, resources="always")
pod = functools.partial(builders.pod, container_name="app", resources="always")


Body = dict[str, Any] | Callable[[Context], dict[str, Any]]


def _body(body: Body, ctx: Context) -> dict[str, Any]:
    return body(ctx) if callable(body) else body


# -- request steps (compared) -----------------------------------------------------------------


def create(kind: str, body: Body, *, dry_run: bool = False) -> Step:
    async def step(ctx: Context) -> Outcome:
        extra = {"dry_run": "All"} if dry_run else {}
        return (await call(ctx, "create", kind, _body(body, ctx), **extra)).outcome(ctx.namespace)

    return step


def patch(kind: str, name: str, body: Body, *, dry_run: bool = False) -> Step:
    """A JSON merge patch of the object (an UPDATE for admission)."""

    async def step(ctx: Context) -> Outcome:
        extra = {"dry_run": "All"} if dry_run else {}
        response = await call(
            ctx, "patch", kind, name, _body(body, ctx), _content_type=MERGE_PATCH, **extra
        )
        return response.outcome(ctx.namespace)

    return step


def create_one_of(kind: str, body: Body, candidates: Sequence[str], *, tries: int = 1) -> Step:
    """A create that two quotas refuse at once. Upstream names the first failing quota *in the
    order its informer's index returns them*, which is Go map order, i.e. random (client-go
    ``threadSafeMap.Index`` ranges over a ``sets.Set``). The outcome is therefore recorded as
    "one of the candidate messages" when it is exactly one of them; which one is noted. The
    request is sent ``tries`` times (dry-run after the first, so nothing is charged) to show the
    order's (non)determinism in the notes."""

    async def step(ctx: Context) -> Outcome:
        outcomes: list[str] = []
        for attempt in range(tries):
            extra = {"dry_run": "All"} if attempt else {}
            response = await call(ctx, "create", kind, _body(body, ctx), **extra)
            outcomes.append(response.outcome(ctx.namespace))
        winners = sorted({o for o in outcomes})
        ctx.notes.append(f"{ctx.mode}: first failing quota over {tries} tries: {winners}")
        if all(o.removeprefix("denied 403: ") in candidates for o in outcomes):
            return "denied 403: exactly one of " + " | ".join(sorted(candidates))
        return f"unexpected: {outcomes}"

    return step


def used(quota: str) -> Step:
    async def step(ctx: Context) -> Outcome:
        response = require(await call(ctx, "read", "resourcequotas", quota), f"read {quota}")
        return describe_used((response.body.get("status") or {}).get("used") or {})

    return step


def unchanged_object(kind: str, name: str, path: Sequence[str]) -> Step:
    """Records one field of a stored object (e.g. a PVC's size after a dry-run update)."""

    async def step(ctx: Context) -> Outcome:
        response = require(await call(ctx, "read", kind, name), f"read {kind}/{name}")
        value: Any = response.body
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        return f"{kind}/{name} {'.'.join(path)}={value}"

    return step


# -- setup steps (not compared) ---------------------------------------------------------------


def _quantities_equal(a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    return set(a) == set(b) and all(
        parse_quantity(a[k]).nanos == parse_quantity(b[k]).nanos for k in a
    )


def _filled(quota: Mapping[str, Any]) -> bool:
    hard = quota["spec"]["hard"]
    status = quota.get("status") or {}
    return _quantities_equal(status.get("hard") or {}, hard) and set(hard) <= set(
        status.get("used") or {}
    )


async def _read_quota(ctx: Context, name: str) -> dict[str, Any]:
    return require(await call(ctx, "read", "resourcequotas", name), f"read {name}").body


def settle(*names: str, used: Mapping[str, Mapping[str, str]] | None = None) -> Step:
    """Wait until each quota's status is filled (``hard`` is ``spec.hard``, a used value for
    every hard name) and, for those in ``used``, until ``status.used`` equals it; then two reads
    0.3 s apart must agree (upstream may still be catching up), then a short grace for the
    admission side's cache."""
    expected = dict(used or {})

    async def step(ctx: Context) -> Outcome:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_WITHIN_S
        previous: dict[str, Any] | None = None
        while True:
            quotas = {name: await _read_quota(ctx, name) for name in names}
            ok = all(_filled(q) for q in quotas.values()) and all(
                _quantities_equal(quotas[n]["status"]["used"], want) for n, want in expected.items()
            )
            snapshot = {n: q.get("status") for n, q in quotas.items()}
            if ok and snapshot == previous:
                await asyncio.sleep(CACHE_GRACE_S)
                return None
            previous = snapshot if ok else None
            if loop.time() > deadline:
                raise AssertionError(
                    f"{ctx.mode}: quotas {names} did not settle (expected used {expected}); "
                    f"last status: {snapshot}"
                )
            await asyncio.sleep(0.3 if ok else 0.1)

    return step


def make_quota(
    name: str,
    hard: Mapping[str, str],
    *,
    scopes: Sequence[str] = (),
    selector: Callable[[Context], Sequence[Mapping[str, Any]]] | None = None,
) -> Step:
    async def step(ctx: Context) -> Outcome:
        await asyncio.sleep(INFORMER_GRACE_S)
        body = builders.resource_quota(
            name, hard, scopes=scopes, scope_selector=selector(ctx) if selector else ()
        )
        require(await call(ctx, "create", "resourcequotas", body), f"create quota {name}")
        return None

    return step


def set_hard(name: str, hard: Mapping[str, str]) -> Step:
    async def step(ctx: Context) -> Outcome:
        await asyncio.sleep(INFORMER_GRACE_S)
        require(
            await call(ctx, "patch", "resourcequotas", name, {"spec": {"hard": dict(hard)}},
                       _content_type=MERGE_PATCH),
            f"set spec.hard of {name}",
        )  # fmt: skip
        return None

    return step


def drop_used(name: str) -> Step:
    """Write the quota's status with ``hard`` and without ``used`` (status subresource).

    Neither controller notices: both ignore quota updates that leave ``spec.hard`` alone
    (upstream's informer UpdateFunc; tally's ``update_quota``), so the quota stays without usage
    until a replenishment, a spec change or the 5-minute resync."""

    async def step(ctx: Context) -> Outcome:
        quota = await _read_quota(ctx, name)
        body = {
            "metadata": {"name": name, "resourceVersion": quota["metadata"]["resourceVersion"]},
            "status": {"hard": quota["status"]["hard"]},
        }
        require(await _replace_status(ctx, name, body), f"drop status.used of {name}")
        return None

    return step


async def _replace_status(ctx: Context, name: str, body: dict[str, Any]) -> Response:
    response = await ctx.core.replace_namespaced_resource_quota_status(
        name, ctx.namespace, body, _preload_content=False
    )
    try:
        raw = await response.read()
    finally:
        response.release()
    return Response(response.status, json.loads(raw) if raw else {})


def delete(kind: str, *names: str) -> Step:
    async def step(ctx: Context) -> Outcome:
        for name in names:
            response = await call(ctx, "delete", kind, name)
            if response.status != 404:
                require(response, f"delete {kind}/{name}")
        return None

    return step


def wait_outcome(kind: str, body: Body, until: Callable[[str], bool], what: str) -> Step:
    """Poll a dry-run create until its outcome satisfies ``until`` (the admission side's view
    has caught up with a change, e.g. a deleted quota or a status written by hand). Dry-run
    requests are never charged, so polling changes nothing."""

    async def step(ctx: Context) -> Outcome:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PROBE_WITHIN_S
        while True:
            outcome = (await call(ctx, "create", kind, _body(body, ctx), dry_run="All")).outcome(
                ctx.namespace
            )
            if until(outcome):
                return None
            if loop.time() > deadline:
                raise AssertionError(f"{ctx.mode}: waiting for {what}; last outcome: {outcome}")
            await asyncio.sleep(0.1)

    return step


def pvc_status(name: str, phase: str, capacity: str) -> Step:
    """What the PV controller would write once the claim is bound (no provisioner runs here)."""

    async def step(ctx: Context) -> Outcome:
        body = {"status": {"phase": phase, "capacity": {"storage": capacity}}}
        response = await ctx.core.patch_namespaced_persistent_volume_claim_status(
            name, ctx.namespace, body, _content_type=MERGE_PATCH, _preload_content=False
        )
        try:
            raw = await response.read()
        finally:
            response.release()
        require(Response(response.status, json.loads(raw)), f"status of pvc {name}")
        return None

    return step


def wait_config_map(name: str) -> Step:
    """kube-controller-manager publishes kube-root-ca.crt into every namespace; wait for it so
    that it is counted from the start and never refused by a quota the script creates."""

    async def step(ctx: Context) -> Outcome:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_WITHIN_S
        while (await call(ctx, "read", "configmaps", name)).status != 200:
            if loop.time() > deadline:
                raise AssertionError(f"{ctx.mode}: configmap {name} never appeared")
            await asyncio.sleep(0.1)
        return None

    return step


def priority_classes(values: Mapping[str, int]) -> Step:
    async def step(ctx: Context) -> Outcome:
        scheduling = client.SchedulingV1Api(ctx.api)
        for suffix, value in values.items():
            name = ctx.cluster_name(suffix)
            await scheduling.create_priority_class({"metadata": {"name": name}, "value": value})
            ctx.cluster_objects.append(("priorityclasses", name))
        return None

    return step


def storage_class(name: str) -> Step:
    """An expandable StorageClass (the PersistentVolumeClaimResize plugin requires one)."""

    async def step(ctx: Context) -> Outcome:
        storage = client.StorageV1Api(ctx.api)
        body = {
            "metadata": {"name": name},
            "provisioner": "example.com/none",
            "allowVolumeExpansion": True,
        }
        try:
            await storage.create_storage_class(body)
        except client.ApiException as error:
            if error.status != 409:
                raise
        return None

    return step


async def cleanup(ctx: Context) -> None:
    scheduling = client.SchedulingV1Api(ctx.api)
    for kind, name in ctx.cluster_objects:
        if kind == "priorityclasses":
            with contextlib.suppress(client.ApiException):
                await scheduling.delete_priority_class(name)


async def run(script: Iterable[Labeled], ctx: Context) -> list[tuple[str, str]]:
    """Run every step in order; the (label, outcome) of every step that has one."""
    outcomes: list[tuple[str, str]] = []
    try:
        for labeled in script:
            outcome = await labeled.step(ctx)
            if outcome is not None:
                outcomes.append((labeled.label, outcome))
    finally:
        await cleanup(ctx)
    return outcomes
