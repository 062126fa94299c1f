"""Builders of the Kubernetes objects tests make, as the plain JSON dicts the API takes.

One module for the unit tests, the e2e tests and the benchmarks. It lives in ``tests/e2e/``
because that folder is already importable everywhere these run: pytest's ``pythonpath`` (in
``pyproject.toml``) puts it on ``sys.path`` for every test, unit and e2e alike, and
``bench/_common.py`` puts it there for the benchmarks (run as plain scripts), so it needs no
configuration of its own (``tests/`` on the path would also make ``unit`` and ``e2e`` importable
names; mypy checks no test module, and ruff knows ``builders`` as first-party). It imports
nothing but the standard library, so a unit test that uses it needs no cluster and no API
client; the e2e tests send what it returns as is (``kubernetes_asyncio`` takes a dict as a body,
``kubectl`` takes its JSON). Unit tests import it as ``import builders`` and usually bind their
module's defaults once, e.g. ``pod = functools.partial(builders.pod, namespace="ns")``.

The rule for every keyword: ``None`` (the default) leaves the field out; any other value, even
an empty one, puts it in. So ``pod("p")`` is the smallest valid pod, and a test that needs an
empty ``labels: {}`` or ``conditions: []`` says so. ``metadata=``, ``spec=`` and ``status=``
take extra fields, merged last (they win over the keywords). A ``uid`` may name the object's
``{name}`` and ``{namespace}``: ``uid="uid-{name}"`` gives each name its own uid, also through a
``functools.partial`` that sets it once for a whole test module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

Obj = dict[str, Any]

IMAGE = "registry.example/app:1"
"""The image of the builders' containers: never pulled (the test planes' kubelets are kwok's
simulated ones, which pull nothing)."""

NO_SCHEDULER = "tally-e2e-no-scheduler"
"""A ``spec.schedulerName`` no scheduler serves: the pod stays Pending and unbound, so no
kubelet (kwok) ever writes its status, and a test that plays the kubelet itself
(``tally_e2e.set_pod_status``) does not race one."""

Resources = Literal["given", "always", "both"]
"""What a container's ``resources`` holds:

* ``"given"``: the field only when ``requests`` or ``limits`` is given, with what is given;
* ``"always"``: the field always (``{}`` with neither), with what is given;
* ``"both"``: the field always, with both ``requests`` and ``limits`` (``{}`` when not given),
  as upstream's Go literals and the API server's output have them.
"""


def _put(target: Obj, key: str, value: Any) -> None:
    if value is not None:
        target[key] = value


def _copy(value: Mapping[str, Any] | None) -> Obj | None:
    return None if value is None else dict(value)


def _typed(api_version: str, kind: str, with_kind: bool) -> Obj:
    return {"apiVersion": api_version, "kind": kind} if with_kind else {}


def object_meta(
    name: str | None = None,
    namespace: str | None = None,
    *,
    generate_name: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    generation: int | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner_references: Sequence[Mapping[str, Any]] | None = None,
    finalizers: Sequence[str] | None = None,
    creation_timestamp: str | None = None,
    deletion_timestamp: str | None = None,
    deletion_grace_period_seconds: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Obj:
    """``metadata``: the fields given, in the API server's order, then ``extra``; ``uid`` with
    ``{name}`` and ``{namespace}`` replaced."""
    meta: Obj = {}
    _put(meta, "name", name)
    _put(meta, "generateName", generate_name)
    _put(meta, "namespace", namespace)
    if uid is not None:
        meta["uid"] = uid.format(name=name, namespace=namespace)
    _put(meta, "resourceVersion", resource_version)
    _put(meta, "generation", generation)
    _put(meta, "creationTimestamp", creation_timestamp)
    _put(meta, "deletionTimestamp", deletion_timestamp)
    _put(meta, "deletionGracePeriodSeconds", deletion_grace_period_seconds)
    _put(meta, "labels", _copy(labels))
    _put(meta, "annotations", _copy(annotations))
    if owner_references is not None:
        meta["ownerReferences"] = [dict(ref) for ref in owner_references]
    if finalizers is not None:
        meta["finalizers"] = list(finalizers)
    meta.update(extra or {})
    return meta


def owner_reference(
    kind: str,
    name: str,
    controller: bool | None = None,
    *,
    api_version: str = "v1",
    uid: str = "u",
) -> Obj:
    """An ``ownerReferences`` entry; ``controller`` only when given."""
    ref: Obj = {"kind": kind, "name": name, "apiVersion": api_version, "uid": uid}
    _put(ref, "controller", controller)
    return ref


# -- pods -------------------------------------------------------------------------------------


def container(
    name: str | None = "a",
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    *,
    image: str | None = IMAGE,
    restart_policy: str | None = None,
    resources: Resources = "given",
) -> Obj:
    """A container: ``name``, ``image`` (each left out when ``None``), ``resources`` as
    :data:`Resources` says, and ``restartPolicy`` (``"Always"``: a sidecar init container)."""
    result: Obj = {}
    _put(result, "name", name)
    _put(result, "image", image)
    held: Obj = {}
    if resources == "both":
        held = {"requests": dict(requests or {}), "limits": dict(limits or {})}
    else:
        _put(held, "requests", _copy(requests))
        _put(held, "limits", _copy(limits))
    if held or resources != "given":
        result["resources"] = held
    _put(result, "restartPolicy", restart_policy)
    return result


def pod(
    name: str | None = "p",
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    *,
    namespace: str | None = None,
    generate_name: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner_references: Sequence[Mapping[str, Any]] | None = None,
    finalizers: Sequence[str] | None = None,
    creation_timestamp: str | None = None,
    deletion_timestamp: str | None = None,
    deletion_grace_period_seconds: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    containers: Sequence[Mapping[str, Any]] | None = None,
    init: Sequence[Mapping[str, Any]] | None = None,
    container_name: str | None = "a",
    image: str | None = IMAGE,
    resources: Resources = "given",
    priority_class_name: str | None = None,
    active_deadline_seconds: int | None = None,
    node_name: str | None = None,
    scheduler_name: str | None = None,
    volumes: Sequence[Mapping[str, Any]] | None = None,
    spec: Mapping[str, Any] | None = None,
    bare: bool = False,
    phase: str | None = None,
    conditions: Sequence[Mapping[str, Any]] | None = None,
    container_statuses: Sequence[Mapping[str, Any]] | None = None,
    status: Mapping[str, Any] | None = None,
    with_kind: bool = False,
) -> Obj:
    """A Pod.

    Its containers are ``containers`` when given (``[]`` too), else one
    :func:`container` named ``container_name`` with ``image``, ``requests``, ``limits`` and
    ``resources``. ``init`` is ``spec.initContainers``. A ``bare`` pod has no default
    container: its ``spec`` holds only the fields given, and is left out when none is (a pod as
    a store or a lister sees it, where only the metadata matters).
    ``status`` is there when ``phase``, ``conditions``, ``container_statuses`` or ``status``
    is given. ``with_kind`` adds ``apiVersion`` and ``kind``.
    """
    body = _typed("v1", "Pod", with_kind)
    body["metadata"] = object_meta(
        name,
        namespace,
        generate_name=generate_name,
        uid=uid,
        resource_version=resource_version,
        labels=labels,
        annotations=annotations,
        owner_references=owner_references,
        finalizers=finalizers,
        creation_timestamp=creation_timestamp,
        deletion_timestamp=deletion_timestamp,
        deletion_grace_period_seconds=deletion_grace_period_seconds,
        extra=metadata,
    )
    pod_spec: Obj = {}
    _put(pod_spec, "volumes", None if volumes is None else [dict(v) for v in volumes])
    if containers is not None:
        pod_spec["containers"] = [dict(c) for c in containers]
    elif not bare:
        pod_spec["containers"] = [
            container(container_name, requests, limits, image=image, resources=resources)
        ]
    _put(pod_spec, "initContainers", None if init is None else [dict(c) for c in init])
    _put(pod_spec, "nodeName", node_name)
    _put(pod_spec, "schedulerName", scheduler_name)
    _put(pod_spec, "priorityClassName", priority_class_name)
    _put(pod_spec, "activeDeadlineSeconds", active_deadline_seconds)
    pod_spec.update(spec or {})
    if pod_spec or not bare:
        body["spec"] = pod_spec
    pod_status: Obj = {}
    _put(pod_status, "phase", phase)
    _put(pod_status, "conditions", None if conditions is None else [dict(c) for c in conditions])
    if container_statuses is not None:
        pod_status["containerStatuses"] = [dict(s) for s in container_statuses]
    pod_status.update(status or {})
    if pod_status or status is not None:
        body["status"] = pod_status
    return body


# -- quotas -----------------------------------------------------------------------------------


def resource_quota(
    name: str | None = "q",
    hard: Mapping[str, str] | None = None,
    used: Mapping[str, str] | None = None,
    *,
    namespace: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    labels: Mapping[str, str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    scopes: Sequence[str] = (),
    scope_selector: Sequence[Mapping[str, Any]] = (),
    spec: Mapping[str, Any] | None = None,
    status_hard: Mapping[str, str] | None = None,
    status: Mapping[str, Any] | None = None,
    hard_in: Literal["spec", "status"] = "spec",
    with_kind: bool = False,
) -> Obj:
    """A ResourceQuota.

    ``hard`` is ``spec.hard``; ``used`` is ``status.used``, and a quota with a ``used`` has
    ``status.hard`` too: ``status_hard`` when given, else ``hard`` (what the controller
    writes). ``hard_in="status"`` puts ``hard`` in ``status.hard`` only (upstream's quota
    literals, which have a status and no ``spec.hard``); ``spec`` and ``status`` are then always
    there, ``{}`` when empty. ``scopes`` and ``scope_selector`` (its ``matchExpressions``) go in
    the spec when not empty. ``spec`` and ``status`` are there when they hold something or are
    given as keywords (their extra fields). A quota with no metadata field has no ``metadata``.
    """
    body = _typed("v1", "ResourceQuota", with_kind)
    meta = object_meta(
        name,
        namespace,
        uid=uid,
        resource_version=resource_version,
        labels=labels,
        extra=metadata,
    )
    if meta:
        body["metadata"] = meta
    literal = hard_in == "status"
    quota_spec: Obj = {}
    if not literal:
        _put(quota_spec, "hard", _copy(hard))
    if scopes:
        quota_spec["scopes"] = list(scopes)
    if scope_selector:
        quota_spec["scopeSelector"] = {"matchExpressions": [dict(e) for e in scope_selector]}
    quota_spec.update(spec or {})
    if quota_spec or spec is not None or literal:
        body["spec"] = quota_spec
    quota_status: Obj = {}
    if status_hard is not None:
        quota_status["hard"] = dict(status_hard)
    elif hard is not None and (literal or used is not None):
        quota_status["hard"] = dict(hard)
    _put(quota_status, "used", _copy(used))
    quota_status.update(status or {})
    if quota_status or status is not None or literal:
        body["status"] = quota_status
    return body


def cluster_quota(
    name: str | None = "team",
    hard: Mapping[str, str] | None = None,
    *,
    selector: Mapping[str, Any] | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    metadata: Mapping[str, Any] | None = None,
    quota: Mapping[str, Any] | None = None,
    spec: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
    with_kind: bool = False,
    kind_only: bool = False,
) -> Obj:
    """A ClusterQuota (``tally.dev/v1alpha1``): ``spec.namespaceSelector`` is ``selector``,
    ``spec.quota`` is ``{"hard": hard}`` plus ``quota`` (its other fields: ``scopes``,
    ``scopeSelector``); ``spec`` adds fields to the spec, ``status`` is the status as given.
    ``with_kind`` adds ``apiVersion`` and ``kind``; ``kind_only`` the ``kind`` alone."""
    body = _typed("tally.dev/v1alpha1", "ClusterQuota", with_kind)
    if kind_only:
        body["kind"] = "ClusterQuota"
    meta = object_meta(name, uid=uid, resource_version=resource_version, extra=metadata)
    if meta:
        body["metadata"] = meta
    quota_spec: Obj = {}
    _put(quota_spec, "namespaceSelector", _copy(selector))
    held: Obj = {}
    _put(held, "hard", _copy(hard))
    held.update(quota or {})
    if held or hard is not None or quota is not None:
        quota_spec["quota"] = held
    quota_spec.update(spec or {})
    body["spec"] = quota_spec
    _put(body, "status", _copy(status))
    return body


# -- other objects ----------------------------------------------------------------------------


def namespace(name: str, *, labels: Mapping[str, str] | None = None) -> Obj:
    """A Namespace."""
    return {"metadata": object_meta(name, labels=labels)}


def config_map(
    name: str,
    namespace: str | None = None,
    *,
    uid: str | None = None,
    data: Mapping[str, str] | None = None,
    with_kind: bool = False,
) -> Obj:
    """A ConfigMap."""
    body = _typed("v1", "ConfigMap", with_kind)
    body["metadata"] = object_meta(name, namespace, uid=uid)
    _put(body, "data", _copy(data))
    return body


def secret(
    name: str,
    namespace: str | None = None,
    *,
    generate: bool = False,
    data: Mapping[str, str] | None = None,
    string_data: Mapping[str, str] | None = None,
    with_kind: bool = False,
) -> Obj:
    """A Secret; ``generate``: ``name`` is its ``generateName`` (the API server adds a suffix)."""
    body = _typed("v1", "Secret", with_kind)
    if generate:
        body["metadata"] = object_meta(generate_name=name, namespace=namespace)
    else:
        body["metadata"] = object_meta(name, namespace)
    _put(body, "data", _copy(data))
    _put(body, "stringData", _copy(string_data))
    return body


def service(
    name: str | None,
    type_: str | None = "ClusterIP",
    *,
    namespace: str | None = None,
    resource_version: str | None = None,
    ports: Sequence[Mapping[str, Any]] | None = None,
    spec: Mapping[str, Any] | None = None,
    with_kind: bool = False,
) -> Obj:
    """A Service of ``type_`` (left out when ``None``) with ``ports``; ``spec`` adds fields."""
    body = _typed("v1", "Service", with_kind)
    meta = object_meta(name, namespace, resource_version=resource_version)
    if meta:
        body["metadata"] = meta
    service_spec: Obj = {}
    _put(service_spec, "type", type_)
    service_spec.update(spec or {})
    if ports is not None:
        service_spec["ports"] = [dict(p) for p in ports]
    body["spec"] = service_spec
    return body


def pvc(
    name: str,
    storage: str,
    *,
    namespace: str | None = None,
    resource_version: str | None = None,
    annotations: Mapping[str, str] | None = None,
    access_modes: Sequence[str] | None = None,
    storage_class: str | None = None,
    spec: Mapping[str, Any] | None = None,
    with_kind: bool = False,
) -> Obj:
    """A PersistentVolumeClaim requesting ``storage``; ``spec`` adds fields."""
    body = _typed("v1", "PersistentVolumeClaim", with_kind)
    body["metadata"] = object_meta(
        name, namespace, resource_version=resource_version, annotations=annotations
    )
    claim: Obj = {}
    if access_modes is not None:
        claim["accessModes"] = list(access_modes)
    claim["resources"] = {"requests": {"storage": storage}}
    _put(claim, "storageClassName", storage_class)
    claim.update(spec or {})
    body["spec"] = claim
    return body


def podset(
    name: str = "web",
    replicas: int | None = None,
    *,
    namespace: str | None = None,
    uid: str | None = None,
    resource_version: str | None = None,
    generation: int | None = None,
    labels: Mapping[str, str] | None = None,
    selector: Mapping[str, str] | None = None,
    template_labels: Mapping[str, str] | None = None,
    containers: Sequence[Mapping[str, Any]] | None = None,
    template_spec: Mapping[str, Any] | None = None,
    spec: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
    with_kind: bool = True,
) -> Obj:
    """A PodSet (``tally.dev/v1alpha1``): ``replicas`` (left out when ``None``), a selector of
    ``selector`` (default ``{"app": name}``), a template labelled ``template_labels`` (default:
    the selector's) whose spec has ``containers`` (default: one :func:`container`) and
    ``template_spec``'s fields; ``spec`` adds fields to the PodSet's spec."""
    body = _typed("tally.dev/v1alpha1", "PodSet", with_kind)
    body["metadata"] = object_meta(
        name,
        namespace,
        uid=uid,
        resource_version=resource_version,
        generation=generation,
        labels=labels,
    )
    match = dict(selector) if selector is not None else {"app": name}
    pod_spec: Obj = {
        "containers": [container()] if containers is None else [dict(c) for c in containers]
    }
    pod_spec.update(template_spec or {})
    set_spec: Obj = {}
    _put(set_spec, "replicas", replicas)
    set_spec["selector"] = {"matchLabels": match}
    set_spec["template"] = {
        "metadata": {"labels": dict(template_labels if template_labels is not None else match)},
        "spec": pod_spec,
    }
    set_spec.update(spec or {})
    body["spec"] = set_spec
    _put(body, "status", _copy(status))
    return body
