"""tally's webhook registration: which requests the API server sends to tally, and how.

One ValidatingWebhookConfiguration holds tally's three webhooks, all served by tally's own
server (:class:`tally.webhook.server.WebhookServer`): quota admission (:data:`WEBHOOK_NAME`,
path ``/quota``), PodSet validation (:data:`PODSET_WEBHOOK_NAME`, ``/validate-podsets``) and
ClusterQuota validation (:data:`CLUSTER_QUOTA_WEBHOOK_NAME`, ``/validate-clusterquotas``).
tally writes it itself (:mod:`tally.webhook.registrar`), with its own timeout and
namespaceSelector, and sends the quota webhook nothing a quota cannot charge: a fail-closed
webhook on leases and events would hurt the whole cluster.

The rules cover exactly what a quota can charge: the core kinds with evaluators or legacy object
counts, plus every ``count/<resource>.<group>`` some quota names, and every other kind with a
registered evaluator (resource claims, measured kinds) that measures a name some quota holds.
They are recomputed as quotas change (:func:`count_resources`). Which operations and
subresources of a kind are sent is what its evaluator declares it handles
(:attr:`~tally.evaluators.base.Evaluator.handled_operations`, :func:`routes`), so an update
reaches tally only where it can charge something: pods (``handles`` takes an update that changes
whether the pod is Terminating; a rule cannot single those out, so every pod update is sent) and
``pods/resize``, services, persistentvolumeclaims, PodSets
and ``podsets/scale``, resource claims (upstream's evaluator takes their updates) and measured
kinds; configmaps, secrets, replicationcontrollers, resourcequotas and every other ``count/``
kind are sent creations only (an object count never changes on update). No ``/status``
subresource is ever sent (:data:`NEVER_ROUTED_SUBRESOURCES`). Rules are grouped per API group
and set of operations, so the configuration stays a handful of rules however many kinds.

Every webhook's client config points at ``<url>/<webhook id>`` — or, in a cluster, at a Service
(``service: {namespace, name, port, path: /<webhook id>}``; URL client configs naming Service
DNS often fail): the server finds the handler by that last path segment and answers any other
path 404.

Fixed fields, whatever the mode: failurePolicy ``Fail`` by default (a quota is a limit
only if creation is refused when tally cannot judge it), sideEffects ``NoneOnDryRun`` (dry-run
requests are judged and never written), timeoutSeconds 10 (upstream's own bound on quota
evaluation), matchPolicy ``Equivalent``. The namespaceSelector of the quota and PodSet webhooks
(:func:`namespace_selector`) skips the exempt namespaces (``TALLY_EXEMPT_NAMESPACES``, kube-system
by default, and the operator's own, so that tally and what it needs can always be restarted)
and, when tally manages only some namespaces (``TALLY_NAMESPACES``), selects exactly those: a
namespace tally does not manage neither pays for nor depends on its webhook. The ClusterQuota
webhook judges cluster-scoped objects, which a namespaceSelector never skips.

Pure: builds the object; :mod:`tally.webhook.registrar` applies it through the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from tally.evaluators.base import Evaluator, GroupResource, Operation
from tally.evaluators.registry import kinds_named, new_registry
from tally.machinery.validation import is_dns1123_label
from tally.quota.resources import hard_names

QUOTA_WEBHOOK_ID: Final = "quota"
"""The quota webhook's id in :class:`~tally.webhook.server.WebhookServer`'s handlers, and so
the last URL path segment of the webhook."""

WEBHOOK_NAME: Final = "quota.tally.dev"

PODSET_WEBHOOK_ID: Final = "validate-podsets"
PODSET_WEBHOOK_NAME: Final = "podsets.tally.dev"
PODSET_RULE: Final = {
    "apiGroups": ["tally.dev"],
    "apiVersions": ["v1alpha1"],
    # The main resource only: status and scale writes are not spec edits to validate.
    "resources": ["podsets"],
    "operations": ["CREATE", "UPDATE"],
    "scope": "Namespaced",
}

CLUSTER_QUOTA_WEBHOOK_ID: Final = "validate-clusterquotas"
CLUSTER_QUOTA_WEBHOOK_NAME: Final = "clusterquotas.tally.dev"
CLUSTER_QUOTA_RULE: Final = {
    "apiGroups": ["tally.dev"],
    "apiVersions": ["v1alpha1"],
    "resources": ["clusterquotas"],
    "operations": ["CREATE", "UPDATE"],
    "scope": "Cluster",
}

CORE_RESOURCES: Final = (
    "pods",
    "services",
    "persistentvolumeclaims",
    "configmaps",
    "secrets",
    "replicationcontrollers",
    "resourcequotas",
)
"""Core kinds upstream's registry evaluates (pods, services, PVCs) or counts with a legacy
alias: covered whatever the quotas name while tally enforces ResourceQuotas. Kinds only; which
of their operations and subresources are sent is their evaluators' to say (:func:`routes`)."""

NEVER_ROUTED_SUBRESOURCES: Final = frozenset({"status"})
"""Subresources no rule names, whatever an evaluator handles (the PersistentVolumeClaim
evaluator takes a claim's status writes: upstream's ``Handles`` looks at the operation only).
A status write reports what a controller or the kubelet observed: refusing it would not undo
what happened, only hide it, and would put tally on the path of every controller's status
writes; and tally's own quota status writes (``resourcequotas/status``) must never pass
through tally's webhook. What a status write changes in usage is counted by the
recalculation it triggers."""

ADMITTED_OPERATIONS: Final = (Operation.CREATE, Operation.UPDATE)
"""The operations quota admission judges (upstream's plugin handles these two only)."""

NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"
"""The label the API server sets on every namespace to its name, which selectors can match."""

TIMEOUT_SECONDS: Final = 10
DEFAULT_EXEMPT_NAMESPACES: Final = ("kube-system",)
DEFAULT_SERVICE_PORT: Final = 443


class Route(NamedTuple):
    """One kind of request the quota webhook's rules send to tally."""

    group_resource: GroupResource
    subresource: str
    """``""`` for the object itself."""
    operation: Operation


class ServiceReference(NamedTuple):
    """The Service in front of tally's webhook server, as the API server addresses it."""

    namespace: str
    name: str
    port: int = DEFAULT_SERVICE_PORT

    @property
    def dns_names(self) -> tuple[str, str]:
        """The names the API server checks the serving certificate against (it dials the
        Service as ``<name>.<namespace>.svc``); the ``cluster.local`` form for other clients."""
        base = f"{self.name}.{self.namespace}.svc"
        return base, f"{base}.cluster.local"


def parse_service_reference(text: str) -> ServiceReference:
    """``<namespace>/<name>`` or ``<namespace>/<name>:<port>`` (port 443 by default)."""
    reference, _, port_text = text.strip().partition(":")
    namespace, slash, name = reference.partition("/")
    if not slash:
        raise ValueError(f"{text!r} is not <namespace>/<name>[:<port>]")
    for part, what in ((namespace, "namespace"), (name, "service name")):
        problems = is_dns1123_label(part)
        if problems:
            raise ValueError(f"{part!r} is not a valid {what} (in {text!r}): {'; '.join(problems)}")
    port = DEFAULT_SERVICE_PORT
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{port_text!r} is not a port number 1-65535 (in {text!r})")
        port = int(port_text)
    return ServiceReference(namespace, name, port)


def count_resources(
    quotas: Iterable[Mapping[str, Any]],
    evaluators: Iterable[Evaluator] = (),
    *,
    core_always: bool = True,
) -> set[GroupResource]:
    """Group/resources named by any quota's spec or status, besides the core kinds already
    covered: by ``count/…``, or by a name one of ``evaluators`` (the registered ones) measures
    (``gold.deviceclass.resource.k8s.io/devices`` names ``resourceclaims.resource.k8s.io``,
    whose creation admission must charge). ``core_always=False``: the core kinds are not
    covered by default either (tally enforces ClusterQuotas only), so they are found the same
    way."""
    found: set[GroupResource] = set()
    covered = {GroupResource("", r) for r in CORE_RESOURCES} if core_always else set()
    registered = list(evaluators)
    # Each set of names once: quotas mostly share theirs, and this runs after every burst of
    # quota writes that changes names (0.17 s over 3 000 quotas, name by name).
    for sections in {hard_names(quota) for quota in quotas}:
        found |= kinds_named(sections, registered, keep=lambda gr: gr not in covered)
    return found


def routes(
    extra: Iterable[GroupResource],
    *,
    core_always: bool = True,
    evaluators: Iterable[Evaluator] = (),
) -> frozenset[Route]:
    """Every request the quota webhook must send: for the core kinds (all of them, or with
    ``core_always=False`` only those in ``extra``) and each kind of ``extra``, what its evaluator
    handles (:attr:`~tally.evaluators.base.Evaluator.handled_operations`) among CREATE and
    UPDATE, without :data:`NEVER_ROUTED_SUBRESOURCES`.

    The evaluator of a kind is the one of ``evaluators`` (the registered ones: PodSets,
    measured kinds …), else the core one, else an object count, exactly as admission picks it
    (:meth:`~tally.evaluators.registry.Registry.get_or_count`); a kind admission ignores
    (events, reviews) gets nothing."""
    registry = new_registry()
    for registered in evaluators:
        registry.register(registered)
    kinds = {GroupResource("", resource) for resource in CORE_RESOURCES} if core_always else set()
    kinds.update(extra)
    found: set[Route] = set()
    for gr in kinds:
        evaluator = registry.get_or_count(gr)
        if evaluator is None:
            continue
        for subresource, operations in evaluator.handled_operations.items():
            if subresource in NEVER_ROUTED_SUBRESOURCES:
                continue
            found.update(
                Route(gr, subresource, operation)
                for operation in ADMITTED_OPERATIONS
                if operation in operations
            )
    return frozenset(found)


def rules_for(wanted: Iterable[Route]) -> list[dict[str, Any]]:
    """Admission rules sending exactly ``wanted``: one rule per API group and set of operations
    (the core group's first, then the others by name), each naming every resource and
    ``<resource>/<subresource>`` sent with that set."""
    operations: dict[tuple[str, str], set[Operation]] = {}
    for route in wanted:
        resource = route.group_resource.resource
        if route.subresource:
            resource = f"{resource}/{route.subresource}"
        operations.setdefault((route.group_resource.group, resource), set()).add(route.operation)
    grouped: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (group, resource), ops in operations.items():
        # In ADMITTED_OPERATIONS' order: CREATE before UPDATE, as kubectl prints them.
        names = tuple(str(op) for op in ADMITTED_OPERATIONS if op in ops)
        grouped.setdefault((group, names), []).append(resource)
    return [
        {
            "apiGroups": [group],
            "apiVersions": ["v1"] if not group else ["*"],
            "resources": sorted(grouped[group, names]),
            "operations": list(names),
            "scope": "Namespaced",
        }
        for group, names in sorted(grouped)
    ]


def webhook_rules(
    extra: Iterable[GroupResource],
    *,
    core_always: bool = True,
    evaluators: Iterable[Evaluator] = (),
) -> list[dict[str, Any]]:
    """The quota webhook's rules: :func:`rules_for` the :func:`routes` of ``extra``."""
    return rules_for(routes(extra, core_always=core_always, evaluators=evaluators))


def namespace_selector(
    exempt_namespaces: Iterable[str], watched_namespaces: Iterable[str] = ()
) -> dict[str, Any]:
    """The namespaces whose requests a namespaced webhook receives: every one but the exempt,
    or, with ``watched_namespaces`` (the namespaces tally manages), exactly those that are not
    exempt. Raises :class:`ValueError` when every watched namespace is exempt: the selector
    would have to select nothing, which ``In`` cannot say."""
    exempt = set(exempt_namespaces)
    watched = set(watched_namespaces)
    if watched:
        selected = sorted(watched - exempt)
        if not selected:
            raise ValueError(
                f"every namespace tally manages is exempt from its webhook: {sorted(watched)}"
            )
        requirement = {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": selected}
    elif exempt:
        requirement = {"key": NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": sorted(exempt)}
    else:
        return {}  # NotIn needs values: an empty selector selects every namespace
    return {"matchExpressions": [requirement]}


def validating_webhook_configuration(
    *,
    name: str,
    url: str,
    ca_bundle: str,
    rules: list[dict[str, Any]],
    failure_policy: str = "Fail",
    exempt_namespaces: Iterable[str] = DEFAULT_EXEMPT_NAMESPACES,
    watched_namespaces: Iterable[str] = (),
    labels: Mapping[str, str] | None = None,
    service: ServiceReference | None = None,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration tally registers (``url`` without the handler id).

    With ``service``, every client config is a Service reference instead and ``url`` is unused.
    ``exempt_namespaces`` and ``watched_namespaces`` (empty: all) make the namespaceSelector of
    the quota and PodSet webhooks (:func:`namespace_selector`); the ClusterQuota webhook keeps
    the exempt-only selector, which it never applies (its objects are cluster-scoped).
    """
    if failure_policy not in ("Fail", "Ignore"):
        raise ValueError(f"failurePolicy must be Fail or Ignore, not {failure_policy!r}")
    exempt = tuple(exempt_namespaces)
    namespaced = namespace_selector(exempt, watched_namespaces)
    base = url.rstrip("/")

    def client_config(handler_id: str) -> dict[str, Any]:
        if service is None:
            return {"url": f"{base}/{handler_id}", "caBundle": ca_bundle}
        return {
            "service": {
                "namespace": service.namespace,
                "name": service.name,
                "path": f"/{handler_id}",
                "port": service.port,
            },
            "caBundle": ca_bundle,
        }

    def webhook(
        name: str,
        handler_id: str,
        webhook_rules: list[dict[str, Any]],
        selector: dict[str, Any],
    ) -> dict[str, Any]:
        return {
            "name": name,
            "clientConfig": client_config(handler_id),
            "rules": webhook_rules,
            "failurePolicy": failure_policy,
            "matchPolicy": "Equivalent",
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "admissionReviewVersions": ["v1"],
            "namespaceSelector": selector,
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": dict(labels or {"app.kubernetes.io/name": "tally"})},
        "webhooks": [
            webhook(WEBHOOK_NAME, QUOTA_WEBHOOK_ID, rules, namespaced),
            webhook(PODSET_WEBHOOK_NAME, PODSET_WEBHOOK_ID, [dict(PODSET_RULE)], namespaced),
            # Cluster-scoped objects: the namespaceSelector never skips them.
            webhook(
                CLUSTER_QUOTA_WEBHOOK_NAME,
                CLUSTER_QUOTA_WEBHOOK_ID,
                [dict(CLUSTER_QUOTA_RULE)],
                namespace_selector(exempt),
            ),
        ],
    }
