"""Differential test of quota admission: the same scripted requests on both control planes.

The script (:func:`build_script`) runs step by step in a fresh namespace in operator mode (tally's
webhook ``quota.tally.dev``, upstream quota off) and in reference mode (upstream's ResourceQuota
admission plugin and quota controller). Every request's outcome — allowed, or denied with the
HTTP code and the message after the API server's prefix — and a few ``status.used`` readings are
recorded; the two lists must be equal. Anchors (:data:`ANCHORS`) pin a few outcomes to upstream's
text explicitly, so the test also fails if both sides went wrong the same way.

Every message of upstream's admission plugin that the API can reach is covered:

* ``exceeded quota`` with one name (configmaps, secrets, pods, nodeports, storage) and with
  several (``requests.cpu,requests.memory``; ``services.loadbalancers,services.nodeports``;
  ``persistentvolumeclaims,requests.storage``);
* ``failed quota: <name>: must specify …`` (one container; several containers and an init
  container; a scoped quota), and constraints winning over an exceeded quota regardless of
  order (step 3 runs for every quota before step 8);
* ``status unknown for quota`` made deterministic: the quota's status is written by hand with
  ``hard`` and without ``used``; neither controller reacts to a status-only update;
* update deltas: PVC expansion charged as the growth; Service ClusterIP → NodePort →
  LoadBalancer; a pod's ``activeDeadlineSeconds`` moving it from NotTerminating to Terminating
  (charged in full to the quota that did not select the old pod); an update that changes no
  usage admitted even when over quota;
* dry-run creates and updates judged (allowed and denied) and never charged;
* a quota already over on one resource admitting requests that do not grow it;
* scoped quotas: BestEffort, NotBestEffort, Terminating/NotTerminating, PriorityClass ``In`` and
  ``Exists`` with PriorityClasses created for the run and deleted afterwards;
* two quotas failing at once: upstream names whichever its informer index returns first, which
  is Go map order and so random (see :func:`admission_script.create_one_of`); the outcome is
  compared as "exactly one of the two quota's correct messages".

Not covered here: ``quota usage is negative`` cannot be reached through the API — object
validation (422) runs before validating admission, and every quota-charged quantity that could be
negative is a validated field; the script records that both modes answer 422 identically.
LimitedResources (``insufficient quota to consume``/``to match these scopes``) needs an admission
configuration file on the API server in reference mode, which the shared fixtures do not set.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import Callable
from typing import Any, Final

from admission_script import (
    Context,
    Labeled,
    Script,
    Step,
    container,
    create,
    create_one_of,
    delete,
    drop_used,
    make_quota,
    patch,
    pod,
    priority_classes,
    pvc_status,
    run,
    set_hard,
    settle,
    storage_class,
    unchanged_object,
    used,
    wait_config_map,
    wait_outcome,
)
from kubernetes_asyncio import client

import builders
from tally_e2e import RunningOperator

STORAGE_CLASS: Final = "tally-diff-expandable"
ROOT_CA: Final = "kube-root-ca.crt"
MIN_REQUESTS: Final = 30


config_map = functools.partial(builders.config_map, data={"k": "v"})
secret = functools.partial(builders.secret, string_data={"k": "v"})
service = functools.partial(builders.service, ports=[{"port": 80}])
pvc = functools.partial(builders.pvc, access_modes=["ReadWriteOnce"], storage_class=STORAGE_CLASS)


def storage(size: str) -> dict[str, Any]:
    return {"spec": {"resources": {"requests": {"storage": size}}}}


def priority_pod(name: str, suffix: str) -> Callable[[Context], dict[str, Any]]:
    def body(ctx: Context) -> dict[str, Any]:
        return pod(name, priority_class_name=ctx.cluster_name(suffix))

    return body


def priority_in(suffix: str) -> Callable[[Context], list[dict[str, Any]]]:
    def selector(ctx: Context) -> list[dict[str, Any]]:
        return [{"scopeName": "PriorityClass", "operator": "In",
                 "values": [ctx.cluster_name(suffix)]}]  # fmt: skip

    return selector


def priority_exists(ctx: Context) -> list[dict[str, Any]]:
    return [{"scopeName": "PriorityClass", "operator": "Exists"}]


def allowed(outcome: str) -> bool:
    return outcome == "allowed"


def exceeded(quota: str, requested: str, used_: str, limited: str) -> str:
    return (
        f"denied 403: exceeded quota: {quota}, requested: {requested}, used: {used_}, "
        f"limited: {limited}"
    )


COMPUTE: Final = {"pods": "10", "requests.cpu": "1", "requests.memory": "1Gi",
                  "limits.memory": "2Gi"}  # fmt: skip
SIX: Final = {"cpu": "600m", "memory": "600Mi"}
AA_PODS_FULL: Final = "exceeded quota: aa-pods, requested: pods=1, used: pods=3, limited: pods=3"
AB_PODS_FULL: Final = (
    "exceeded quota: ab-pods, requested: count/pods=1, used: count/pods=3, limited: count/pods=3"
)

# Upstream's words for a few steps, written out so that a bug shared by both sides still fails.
ANCHORS: Final = {
    "B no quota tracks configmaps: create": "allowed",
    "C objects: cm-2 over configmaps": exceeded(
        "objects", "configmaps=1", "configmaps=3", "configmaps=3"
    ),
    "C objects: cm-2 over configmaps, dry-run": exceeded(
        "objects", "configmaps=1", "configmaps=3", "configmaps=3"
    ),
    "C objects: used after dry-run": "used {configmaps=2,secrets=0}",
    "C objects: generateName secret over secrets": exceeded(
        "objects", "secrets=1", "secrets=2", "secrets=2"
    ),
    "D compute: pod without resources": (
        "denied 403: failed quota: compute: must specify limits.memory for: app; "
        "requests.cpu for: app; requests.memory for: app"
    ),
    "D compute: c-2 over cpu and memory": exceeded(
        "compute",
        "requests.cpu=600m,requests.memory=600Mi",
        "requests.cpu=600m,requests.memory=600Mi",
        "requests.cpu=1,requests.memory=1Gi",
    ),
    "D compute: over on memory, pod requesting memory 0": "allowed",
    "D compute: over on memory, pod requesting 1Mi": exceeded(
        "compute", "requests.memory=1Mi", "requests.memory=1000Mi", "requests.memory=512Mi"
    ),
    "E order: constraint of zz-limits wins over aa-pods exceeded": (
        "denied 403: failed quota: zz-limits: must specify limits.cpu for: app"
    ),
    "H svc: NodePort → LoadBalancer": "allowed",
    "H svc: second LoadBalancer": exceeded(
        "svc",
        "services.loadbalancers=1,services.nodeports=1",
        "services.loadbalancers=1,services.nodeports=1",
        "services.loadbalancers=1,services.nodeports=1",
    ),
    "I pvc: expand 2Gi → 4Gi charged as 2Gi": exceeded(
        "storage", "requests.storage=2Gi", "requests.storage=2Gi", "requests.storage=3Gi"
    ),
    "I pvc: used after dry-run expansion": (
        "used {persistentvolumeclaims=1,requests.storage=1073741824}"
    ),
    "J term: pn-1 gets a deadline, terminating full": exceeded(
        "terminating", "pods=1", "pods=1", "pods=1"
    ),
    "K unknown: secret while used is missing": (
        "denied 403: status unknown for quota: unknown, resources: count/secrets,secrets"
    ),
}


def build_script() -> Script:
    s: Script = []

    def step(label: str, body: Step) -> None:
        s.append(Labeled(label, body))

    # A: the cluster-scoped objects the script needs; kube-root-ca.crt counted from the start.
    step("A setup", wait_config_map(ROOT_CA))
    step("A storage class", storage_class(STORAGE_CLASS))
    step("A priority classes", priority_classes({"high": 1000, "low": 100}))

    # B: a namespace without quotas admits everything.
    step("B no quota tracks configmaps: create", create("configmaps", config_map("cm-free")))

    # C: object counts; exceeded with one name; dry-run judged and never charged.
    step("C quota", make_quota("objects", {"configmaps": "3", "secrets": "2"}))
    step("C settle", settle("objects", used={"objects": {"configmaps": "2", "secrets": "0"}}))
    step("C objects: cm-1 dry-run", create("configmaps", config_map("cm-1"), dry_run=True))
    step("C objects: used after dry-run", used("objects"))
    step("C objects: cm-1", create("configmaps", config_map("cm-1")))
    step("C objects: cm-2 over configmaps", create("configmaps", config_map("cm-2")))
    step("C objects: cm-2 over configmaps, dry-run",
         create("configmaps", config_map("cm-2"), dry_run=True))  # fmt: skip
    step("C objects: update cm-1 while over (not charged)",
         patch("configmaps", "cm-1", {"data": {"k": "changed"}}))  # fmt: skip
    step("C objects: s-1", create("secrets", secret("s-1")))
    step("C objects: s-2", create("secrets", secret("s-2")))
    step("C objects: generateName secret over secrets",
         create("secrets", secret("gen-", generate=True)))  # fmt: skip
    step("C objects: used", used("objects"))
    step("C teardown", delete("resourcequotas", "objects"))
    step("C wait", wait_outcome("configmaps", config_map("probe"), allowed, "objects gone"))

    # D: compute; must-specify; exceeded with several names; over on an unrelated resource.
    step("D quota", make_quota("compute", COMPUTE))
    step("D settle", settle("compute"))
    step("D compute: pod without resources", create("pods", pod("c-none")))
    step("D compute: containers and init container missing some",
         create("pods", pod("c-multi", containers=[
             container("a", {"cpu": "100m", "memory": "100Mi"}, {"memory": "100Mi"}),
             container("b", {"cpu": "100m", "memory": "100Mi"}),
         ], init=[container("i")])))  # fmt: skip
    step("D compute: c-1", create("pods", pod("c-1", SIX, {"memory": "600Mi"})))
    step("D compute: used after c-1", used("compute"))
    step("D compute: c-2 over cpu and memory",
         create("pods", pod("c-2", SIX, {"memory": "600Mi"})))  # fmt: skip
    small = pod("c-2", {"cpu": "300m", "memory": "400Mi"}, {"memory": "400Mi"})
    step("D compute: c-2 smaller, dry-run", create("pods", small, dry_run=True))
    step("D compute: used after dry-run", used("compute"))
    step("D compute: c-2 smaller", create("pods", small))
    step("D compute: lower requests.memory below used",
         set_hard("compute", {**COMPUTE, "requests.memory": "512Mi"}))  # fmt: skip
    step("D settle lowered", settle("compute", used={"compute": {
        "pods": "2", "requests.cpu": "900m", "requests.memory": "1000Mi",
        "limits.memory": "1000Mi"}}))  # fmt: skip
    step(
        "D compute: over on memory, pod requesting memory 0",
        create("pods", pod("c-zero-mem", {"cpu": "100m", "memory": "0"}, {"memory": "0"})),
    )
    step(
        "D compute: over on memory, pod requesting 1Mi",
        create("pods", pod("c-more-mem", {"cpu": "0", "memory": "1Mi"}, {"memory": "1Mi"})),
    )
    step("D compute: used", used("compute"))
    step("D teardown", delete("resourcequotas", "compute"))
    step("D wait", wait_outcome("pods", pod("probe"), allowed, "compute gone"))

    # E: which failure wins. Constraints (step 3) are checked for every quota before any
    # quota's limit (step 8), so zz-limits' must-specify beats aa-pods' exceeded; two exceeded
    # quotas race in upstream's map order.
    step("E quotas", make_quota("aa-pods", {"pods": "3"}))
    step("E quotas 2", make_quota("zz-limits", {"limits.cpu": "4"}))
    step(
        "E settle",
        settle(
            "aa-pods",
            "zz-limits",
            used={"aa-pods": {"pods": "3"}, "zz-limits": {"limits.cpu": "0"}},
        ),
    )
    step("E order: constraint of zz-limits wins over aa-pods exceeded",
         create("pods", pod("d-1")))  # fmt: skip
    with_limits = pod("d-2", limits={"cpu": "100m"})
    step("E order: only aa-pods fails", create("pods", with_limits))
    step("E quotas 3", make_quota("ab-pods", {"count/pods": "3"}))
    step("E settle 2", settle("ab-pods", used={"ab-pods": {"count/pods": "3"}}))
    step(
        "E order: aa-pods and ab-pods both fail",
        create_one_of("pods", with_limits, [AA_PODS_FULL, AB_PODS_FULL], tries=8),
    )
    step("E used aa-pods", used("aa-pods"))
    step("E used ab-pods", used("ab-pods"))
    step("E teardown", delete("resourcequotas", "aa-pods", "ab-pods", "zz-limits"))
    step("E wait", wait_outcome("pods", pod("probe"), allowed, "order quotas gone"))

    # F: BestEffort / NotBestEffort.
    step("F quotas", make_quota("best-effort", {"pods": "1"}, scopes=["BestEffort"]))
    step("F quotas 2", make_quota("not-best-effort", {"pods": "4", "requests.cpu": "2"},
                                  scopes=["NotBestEffort"]))  # fmt: skip
    step("F settle", settle("best-effort", "not-best-effort", used={
        "best-effort": {"pods": "0"},
        "not-best-effort": {"pods": "3", "requests.cpu": "1"},
    }))  # fmt: skip
    step("F scoped: be-1", create("pods", pod("be-1")))
    step("F scoped: be-2 over best-effort", create("pods", pod("be-2")))
    step("F scoped: be-2 dry-run over best-effort", create("pods", pod("be-2"), dry_run=True))
    step("F scoped: nbe-1", create("pods", pod("nbe-1", {"cpu": "100m"})))
    step("F scoped: nbe-2 over not-best-effort", create("pods", pod("nbe-2", {"cpu": "100m"})))
    step("F scoped: memory-only pod, must specify cpu",
         create("pods", pod("nbe-mem", {"memory": "64Mi"})))  # fmt: skip
    step("F used best-effort", used("best-effort"))
    step("F used not-best-effort", used("not-best-effort"))
    step("F teardown", delete("resourcequotas", "best-effort", "not-best-effort"))
    step("F wait", wait_outcome("pods", pod("probe"), allowed, "scoped quotas gone"))

    # G: PriorityClass selectors.
    step("G quotas", make_quota("prio-high", {"pods": "1"}, selector=priority_in("high")))
    step("G quotas 2", make_quota("prio-any", {"pods": "2"}, selector=priority_exists))
    step(
        "G settle",
        settle(
            "prio-high", "prio-any", used={"prio-high": {"pods": "0"}, "prio-any": {"pods": "0"}}
        ),
    )
    step("G prio: ph-1", create("pods", priority_pod("ph-1", "high")))
    step("G prio: ph-2 over prio-high", create("pods", priority_pod("ph-2", "high")))
    step("G prio: pl-1", create("pods", priority_pod("pl-1", "low")))
    step("G prio: pl-2 over prio-any", create("pods", priority_pod("pl-2", "low")))
    step("G prio: pn-1 without class", create("pods", pod("pn-1")))
    step("G used prio-high", used("prio-high"))
    step("G used prio-any", used("prio-any"))
    step("G teardown", delete("resourcequotas", "prio-high", "prio-any"))
    step("G wait", wait_outcome("pods", priority_pod("probe", "high"), allowed, "prio gone"))

    # H: Services, type changes charged as deltas.
    svc_hard = {"services": "3", "services.nodeports": "1", "services.loadbalancers": "1"}
    step("H quota", make_quota("svc", svc_hard))
    step("H settle", settle("svc"))
    step("H svc: web ClusterIP", create("services", service("web")))
    step(
        "H svc: ClusterIP → NodePort dry-run",
        patch("services", "web", {"spec": {"type": "NodePort"}}, dry_run=True),
    )
    step("H svc: used after dry-run", used("svc"))
    step("H svc: ClusterIP → NodePort", patch("services", "web", {"spec": {"type": "NodePort"}}))
    step("H svc: used after NodePort", used("svc"))
    step("H svc: second NodePort", create("services", service("web2", "NodePort")))
    step("H svc: NodePort → LoadBalancer",
         patch("services", "web", {"spec": {"type": "LoadBalancer"}}))  # fmt: skip
    step("H svc: used after LoadBalancer", used("svc"))
    step("H svc: second LoadBalancer", create("services", service("web3", "LoadBalancer")))
    step("H svc: label change while full",
         patch("services", "web", {"metadata": {"labels": {"a": "b"}}}))  # fmt: skip
    step("H svc: web4 ClusterIP", create("services", service("web4")))
    step("H svc: web5 ClusterIP", create("services", service("web5")))
    step("H svc: web6 over services", create("services", service("web6")))
    step("H teardown", delete("resourcequotas", "svc"))

    # I: PVCs; expansion charged as the growth.
    step("I quota", make_quota("storage", {"requests.storage": "3Gi",
                                           "persistentvolumeclaims": "2"}))  # fmt: skip
    step("I settle", settle("storage"))
    step("I pvc: data 1Gi", create("persistentvolumeclaims", pvc("data", "1Gi")))
    step("I bind", pvc_status("data", "Bound", "1Gi"))
    step(
        "I pvc: expand 1Gi → 2Gi dry-run",
        patch("persistentvolumeclaims", "data", storage("2Gi"), dry_run=True),
    )
    step("I pvc: used after dry-run expansion", used("storage"))
    step(
        "I pvc: size after dry-run expansion",
        unchanged_object(
            "persistentvolumeclaims", "data", ("spec", "resources", "requests", "storage")
        ),
    )
    step("I pvc: expand 1Gi → 2Gi", patch("persistentvolumeclaims", "data", storage("2Gi")))
    step("I pvc: used after expansion", used("storage"))
    step(
        "I pvc: expand 2Gi → 4Gi charged as 2Gi",
        patch("persistentvolumeclaims", "data", storage("4Gi")),
    )
    step("I pvc: data2 1500Mi over storage",
         create("persistentvolumeclaims", pvc("data2", "1500Mi")))  # fmt: skip
    step("I pvc: data3 1Gi", create("persistentvolumeclaims", pvc("data3", "1Gi")))
    step("I pvc: data4 over claims and storage",
         create("persistentvolumeclaims", pvc("data4", "1Mi")))  # fmt: skip
    step("I pvc: used", used("storage"))
    step("I teardown", delete("resourcequotas", "storage"))

    # J: activeDeadlineSeconds moves a pod from NotTerminating to Terminating. Pods so far:
    # c-1, c-2, c-zero-mem, be-1, nbe-1, ph-1, pl-1, pn-1 (none has a deadline).
    step("J quotas", make_quota("terminating", {"pods": "1"}, scopes=["Terminating"]))
    step("J quotas 2", make_quota("not-terminating", {"pods": "20"}, scopes=["NotTerminating"]))
    step("J settle", settle("terminating", "not-terminating", used={
        "terminating": {"pods": "0"}, "not-terminating": {"pods": "8"}}))  # fmt: skip
    step("J term: t-1 with a deadline", create("pods", pod("t-1", active_deadline_seconds=600)))
    deadline = {"spec": {"activeDeadlineSeconds": 300}}
    step("J term: pn-1 gets a deadline, terminating full", patch("pods", "pn-1", deadline))
    step("J raise terminating", set_hard("terminating", {"pods": "2"}))
    step("J settle 2", settle("terminating", used={"terminating": {"pods": "1"}}))
    step("J term: pn-1 gets a deadline, dry-run", patch("pods", "pn-1", deadline, dry_run=True))
    step("J term: used after dry-run", used("terminating"))
    step("J term: pn-1 gets a deadline", patch("pods", "pn-1", deadline))
    step("J term: used after scope change", used("terminating"))
    step("J term: t-1 shorter deadline (same scope)",
         patch("pods", "t-1", {"spec": {"activeDeadlineSeconds": 100}}))  # fmt: skip
    step("J term: t-2 over terminating",
         create("pods", pod("t-2", active_deadline_seconds=60)))  # fmt: skip
    step("J teardown", delete("resourcequotas", "terminating", "not-terminating"))

    # K: status unknown. The controllers ignore status-only updates, so a status written with
    # hard and without used stays that way.
    unknown_hard = {"secrets": "10", "count/secrets": "10"}
    step("K quota", make_quota("unknown", unknown_hard))
    step("K settle", settle("unknown", used={"unknown": {"secrets": "2", "count/secrets": "2"}}))
    step("K drop used", drop_used("unknown"))
    step(
        "K wait",
        wait_outcome("secrets", secret("probe"), lambda o: "status unknown" in o, "status unknown"),
    )
    step("K unknown: secret while used is missing", create("secrets", secret("s-unknown")))
    step("K unknown: configmap (not tracked by the quota)",
         create("configmaps", config_map("cm-unknown")))  # fmt: skip
    step("K refill", set_hard("unknown", {**unknown_hard, "secrets": "11"}))
    step("K settle 2", settle("unknown", used={"unknown": {"secrets": "2", "count/secrets": "2"}}))
    step("K unknown: secret once used is back", create("secrets", secret("s-known")))
    step("K used", used("unknown"))
    step("K teardown", delete("resourcequotas", "unknown"))

    # L: negative usage is refused by validation (422) before any admission plugin runs.
    step("L quota", make_quota("negative", {"requests.cpu": "1", "requests.storage": "1Gi"}))
    step("L settle", settle("negative"))
    step("L negative: pod with cpu -1", create("pods", pod("neg", {"cpu": "-1"})))
    step("L negative: pvc with storage -1Gi", create("persistentvolumeclaims", pvc("neg", "-1Gi")))
    step("L used", used("negative"))
    return s


def _report(upstream: list[tuple[str, str]], tally: list[tuple[str, str]]) -> str:
    lines = []
    for (label, want), (_, got) in zip(upstream, tally, strict=False):
        if want != got:
            lines.append(f"- {label}\n    upstream: {want}\n    tally:    {got}")
    if len(upstream) != len(tally):
        lines.append(f"- {len(upstream)} upstream outcomes, {len(tally)} tally outcomes")
    return "\n".join(lines)


async def test_tally_admits_and_denies_like_upstream(
    operator: RunningOperator,
    api: client.ApiClient,
    namespace: str,
    reference_api: client.ApiClient,
    reference_namespace: str,
) -> None:
    script = build_script()
    labels = Counter(step.label for step in script)
    assert [label for label, n in labels.items() if n > 1] == []
    tally_ctx = Context(api, namespace, "operator")
    upstream_ctx = Context(reference_api, reference_namespace, "reference")
    tally, upstream = await asyncio.gather(run(script, tally_ctx), run(script, upstream_ctx))
    for label, outcome in upstream:
        print(f"{label}: {outcome}")
    for note in upstream_ctx.notes + tally_ctx.notes:
        print(note)

    requests = [o for _, o in upstream if o == "allowed" or o.startswith("denied")]
    assert len(requests) >= MIN_REQUESTS, upstream
    by_label = dict(upstream)
    for label, want in ANCHORS.items():
        assert by_label.get(label) == want, f"upstream's outcome for {label!r}"
    mismatches = _report(upstream, tally)
    assert not mismatches, "tally answered differently from upstream:\n" + mismatches
    assert tally == upstream
