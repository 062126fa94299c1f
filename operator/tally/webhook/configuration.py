"""The quota webhook's registration: which requests the API server sends to tally, and how.

tally manages its ValidatingWebhookConfiguration itself instead of letting Kopf do it, because
Kopf's managed configuration has ``timeoutSeconds: 30`` hard-coded and no namespaceSelector, and
would list every resource its handlers match — tally's handler matches everything, and a
fail-closed webhook on leases and events would hurt the whole cluster.

The rules cover exactly what a quota can charge: the core kinds with evaluators or legacy object
counts, plus every ``count/<resource>.<group>`` some quota names, and every other kind with a
registered evaluator (resource claims) that measures a name some quota holds. They are
recomputed as quotas change (:func:`count_resources`). Every webhook's client config points at
``<url>/<handler-id>`` — or, in a cluster, at a Service (``service: {namespace, name, port,
path: /<handler-id>}``; URL client configs naming Service DNS often fail, kopf#1071): a Kopf
webhook path without a handler id runs no handler and allows everything.

Fixed fields, whatever the mode: failurePolicy ``Fail`` by default (a quota is a limit
only if creation is refused when tally cannot judge it), sideEffects ``NoneOnDryRun`` (dry-run
requests are judged and never written), timeoutSeconds 10 (upstream's own bound on quota
evaluation), matchPolicy ``Equivalent``, and a namespaceSelector that exempts ``kube-system``
and the operator's own namespace (so that tally can always be restarted).

Pure: builds the object; :mod:`tally.app.handlers` applies it through the API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from tally.evaluators.base import Evaluator, GroupResource
from tally.evaluators.registry import group_resource_for_count_name

QUOTA_WEBHOOK_ID: Final = "quota"
"""The Kopf handler id, and so the last URL path segment of the webhook."""

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
    "pods/resize",  # an in-place resize is charged by its growth, as upstream charges it
    "services",
    "persistentvolumeclaims",
    "configmaps",
    "secrets",
    "replicationcontrollers",
    "resourcequotas",
)
"""Core kinds upstream's registry evaluates (pods, services, PVCs) or counts with a legacy
alias. Never a ``/status`` subresource: tally's own quota status writes must not pass through
tally's webhook."""

TIMEOUT_SECONDS: Final = 10
DEFAULT_EXEMPT_NAMESPACES: Final = ("kube-system",)
DEFAULT_SERVICE_PORT: Final = 443
_DNS1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


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
        if not _DNS1123_LABEL.fullmatch(part):
            raise ValueError(f"{part!r} is not a valid {what} (in {text!r})")
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
    candidates = [e for e in evaluators if e.group_resource not in covered]
    for quota in quotas:
        for section in ("spec", "status"):
            hard = (quota.get(section) or {}).get("hard") or {}
            if not isinstance(hard, Mapping):
                continue
            names = [str(name) for name in hard]
            for name in names:
                gr = group_resource_for_count_name(name)
                if gr is not None and gr not in covered:
                    found.add(gr)
            for evaluator in candidates:
                if evaluator.group_resource not in found and evaluator.matching_resources(names):
                    found.add(evaluator.group_resource)
    return found


def webhook_rules(
    extra: Iterable[GroupResource],
    *,
    core_always: bool = True,
    subresources: Mapping[GroupResource, Iterable[str]] | None = None,
) -> list[dict[str, Any]]:
    """Admission rules: the core kinds (all of them, or with ``core_always=False`` only those
    in ``extra``), then one rule per API group of ``extra``; each kind of ``extra`` with the
    ``subresources`` whose writes its evaluator charges (``podsets/scale``)."""
    subresources = subresources or {}
    operations = ["CREATE", "UPDATE"]
    extra = list(extra)
    core = (set(CORE_RESOURCES) if core_always else set()) | {
        gr.resource for gr in extra if not gr.group
    }
    if "pods" in core:
        core.add("pods/resize")  # an in-place resize is charged by its growth
    rules: list[dict[str, Any]] = []
    if core:
        rules.append(
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": sorted(core),
                "operations": operations,
                "scope": "Namespaced",
            }
        )
    by_group: dict[str, set[str]] = {}
    for gr in extra:
        if gr.group:
            by_group.setdefault(gr.group, set()).update(
                [gr.resource, *(f"{gr.resource}/{sub}" for sub in subresources.get(gr, ()))]
            )
    for group in sorted(by_group):
        rules.append(
            {
                "apiGroups": [group],
                "apiVersions": ["*"],
                "resources": sorted(by_group[group]),
                "operations": operations,
                "scope": "Namespaced",
            }
        )
    return rules


def validating_webhook_configuration(
    *,
    name: str,
    url: str,
    ca_bundle: str,
    rules: list[dict[str, Any]],
    failure_policy: str = "Fail",
    exempt_namespaces: Iterable[str] = DEFAULT_EXEMPT_NAMESPACES,
    labels: Mapping[str, str] | None = None,
    service: ServiceReference | None = None,
) -> dict[str, Any]:
    """The ValidatingWebhookConfiguration tally registers (``url`` without the handler id).

    With ``service``, every client config is a Service reference instead and ``url`` is unused.
    """
    if failure_policy not in ("Fail", "Ignore"):
        raise ValueError(f"failurePolicy must be Fail or Ignore, not {failure_policy!r}")
    exempt = sorted(set(exempt_namespaces))
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

    def webhook(name: str, handler_id: str, webhook_rules: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "name": name,
            "clientConfig": client_config(handler_id),
            "rules": webhook_rules,
            "failurePolicy": failure_policy,
            "matchPolicy": "Equivalent",
            "sideEffects": "NoneOnDryRun",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "admissionReviewVersions": ["v1"],
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": exempt}
                ]
            },
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": dict(labels or {"app.kubernetes.io/name": "tally"})},
        "webhooks": [
            webhook(WEBHOOK_NAME, QUOTA_WEBHOOK_ID, rules),
            webhook(PODSET_WEBHOOK_NAME, PODSET_WEBHOOK_ID, [dict(PODSET_RULE)]),
            # Cluster-scoped objects: the namespaceSelector never skips them.
            webhook(
                CLUSTER_QUOTA_WEBHOOK_NAME, CLUSTER_QUOTA_WEBHOOK_ID, [dict(CLUSTER_QUOTA_RULE)]
            ),
        ],
    }
