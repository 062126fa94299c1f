"""tally.webhook.configuration: the registered rules cover what quotas can charge, and nothing
else."""

from __future__ import annotations

import asyncio
import datetime
import functools
from pathlib import Path
from typing import Any, cast

import pytest

import builders
from tally.app.settings import Settings, SettingsError
from tally.evaluators.base import Evaluator, GroupResource, Operation
from tally.evaluators.measured import MeasuredEvaluator
from tally.evaluators.podsets import PODSETS, PodSetEvaluator
from tally.evaluators.pvcs import PersistentVolumeClaimEvaluator
from tally.evaluators.registry import Registry, new_registry
from tally.measures import compile_measure
from tally.webhook import certs
from tally.webhook.configuration import (
    NEVER_ROUTED_SUBRESOURCES,
    Route,
    ServiceReference,
    count_resources,
    namespace_selector,
    parse_service_reference,
    validating_webhook_configuration,
    webhook_rules,
)
from tally.webhook.registrar import REFRESH_DEBOUNCE_S, RULES_SETTLE_S, WebhookRegistrar
from tally.webhook.tls import MemorySource, ServingTLS

pytestmark = pytest.mark.unit

WIDGETS = GroupResource("example.com", "widgets")


# Quotas as the registrar reads them: spec.hard and status.hard ({} unless given), no metadata.
quota = functools.partial(builders.resource_quota, None, status_hard={})


@pytest.mark.parametrize(
    ("quotas", "expected"),
    [
        pytest.param([quota({"pods": "1", "cpu": "1"})], set(), id="core-only"),
        pytest.param(
            [quota({"count/deployments.apps": "1"}), quota({"count/podsets.tally.dev": "2"})],
            {GroupResource("apps", "deployments"), GroupResource("tally.dev", "podsets")},
            id="groups",
        ),
        pytest.param(
            [quota({"count/secrets": "1", "count/endpoints": "1"})],
            {GroupResource("", "endpoints")},
            id="core-count-not-already-covered",
        ),
        pytest.param(
            [quota({}, status_hard={"count/jobs.batch": "1"})],
            {GroupResource("batch", "jobs")},
            id="removed-from-spec-but-still-in-status",
        ),
    ],
)
def test_count_resources(quotas: list[dict[str, Any]], expected: set[GroupResource]) -> None:
    assert count_resources(quotas) == expected


def test_count_resources_by_a_registered_evaluators_names() -> None:
    # Admission must charge claim creation against gold.deviceclass.resource.k8s.io/devices:
    # the registered claim evaluator measures the name, so claims get a rule. Core kinds'
    # names (services.nodeports) add nothing: they are covered already.
    claims = GroupResource("resource.k8s.io", "resourceclaims")
    evaluators = new_registry().list()
    gold = quota({"gold.deviceclass.resource.k8s.io/devices": "1"})
    in_status = quota({}, status_hard={"silver.deviceclass.resource.k8s.io/devices": "1"})
    assert count_resources([gold], evaluators) == {claims}
    assert count_resources([in_status], evaluators) == {claims}
    assert count_resources([quota({"services.nodeports": "1", "cpu": "1"})], evaluators) == set()
    assert count_resources([gold]) == set()  # without evaluators, count/ names only
    rules = webhook_rules(count_resources([gold], evaluators))
    # Upstream's claimEvaluator.Handles (resource_claims.go): CREATE and UPDATE, no subresource.
    assert [r for r in rules if r["apiGroups"] == ["resource.k8s.io"]] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["*"],
            "resources": ["resourceclaims"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]


def test_rules_never_include_status_or_everything() -> None:
    rules = webhook_rules({GroupResource("apps", "deployments"), GroupResource("", "endpoints")})
    resources = [r for rule in rules for r in rule["resources"]]
    assert "*" not in resources
    assert not any(r.endswith("/status") for r in resources)
    assert rules[0]["apiGroups"] == [""]
    core = [r for rule in rules if rule["apiGroups"] == [""] for r in rule["resources"]]
    assert "endpoints" in core
    assert "pods/resize" in core
    # count/deployments.apps: upstream's objectCountEvaluator.Handles takes CREATE only.
    assert [r for r in rules if r["apiGroups"] == ["apps"]] == [
        {
            "apiGroups": ["apps"],
            "apiVersions": ["*"],
            "resources": ["deployments"],
            "operations": ["CREATE"],
            "scope": "Namespaced",
        }
    ]


def test_configuration_fields_hold() -> None:
    config = validating_webhook_configuration(
        name="tally.dev",
        url="https://127.0.0.1:9443/",
        ca_bundle="Q0E=",
        rules=webhook_rules(()),
        exempt_namespaces=["kube-system", "tally-system"],
    )
    webhook, podsets, cluster_quotas = config["webhooks"]
    # A bare path would run no handler (404, and the failure policy decides).
    assert webhook["clientConfig"]["url"] == "https://127.0.0.1:9443/quota"
    assert podsets["clientConfig"]["url"] == "https://127.0.0.1:9443/validate-podsets"
    assert podsets["rules"][0]["resources"] == ["podsets"]
    assert podsets["failurePolicy"] == "Fail"
    assert cluster_quotas["clientConfig"]["url"] == "https://127.0.0.1:9443/validate-clusterquotas"
    assert cluster_quotas["rules"][0]["resources"] == ["clusterquotas"]
    assert cluster_quotas["rules"][0]["scope"] == "Cluster"
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "NoneOnDryRun"
    assert webhook["timeoutSeconds"] <= 10
    assert webhook["matchPolicy"] == "Equivalent"
    assert webhook["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "tally-system"],
        }
    ]


def test_bad_failure_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="failurePolicy"):
        validating_webhook_configuration(
            name="x", url="https://h", ca_bundle="", rules=[], failure_policy="Maybe"
        )


# -- in a cluster: a Service client config (TALLY_WEBHOOK_SERVICE)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "tally-system/tally-webhook",
            ServiceReference("tally-system", "tally-webhook", 443),
            id="default-port",
        ),
        pytest.param("ns/svc:8443", ServiceReference("ns", "svc", 8443), id="port"),
    ],
)
def test_service_reference_parses(text: str, expected: ServiceReference) -> None:
    assert parse_service_reference(text) == expected


@pytest.mark.parametrize(
    "text",
    ["tally-webhook", "/svc", "ns/", "ns/Svc", "ns/svc:0", "ns/svc:65536", "ns/svc:https", "a/b/c"],
)
def test_bad_service_reference_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not"):
        parse_service_reference(text)


def test_service_client_config_replaces_the_url() -> None:
    config = validating_webhook_configuration(
        name="tally.dev",
        url="https://tally-webhook.tally-system.svc:9443",
        ca_bundle="Q0E=",
        rules=webhook_rules(()),
        service=ServiceReference("tally-system", "tally-webhook"),
    )
    webhook, podsets, _ = config["webhooks"]
    # Every path still ends in the handler id: a bare path would allow everything.
    assert webhook["clientConfig"] == {
        "service": {
            "namespace": "tally-system",
            "name": "tally-webhook",
            "path": "/quota",
            "port": 443,
        },
        "caBundle": "Q0E=",
    }
    assert podsets["clientConfig"]["service"]["path"] == "/validate-podsets"
    assert "url" not in podsets["clientConfig"]


def test_service_dns_names_are_what_the_api_server_checks() -> None:
    assert ServiceReference("tally-system", "tally-webhook").dns_names == (
        "tally-webhook.tally-system.svc",
        "tally-webhook.tally-system.svc.cluster.local",
    )


def test_service_setting() -> None:
    assert Settings.from_env({}).webhook_service_ref is None
    settings = Settings.from_env({"TALLY_WEBHOOK_SERVICE": "tally-system/tally-webhook:8443"})
    assert settings.webhook_service_ref == ServiceReference("tally-system", "tally-webhook", 8443)
    with pytest.raises(SettingsError, match="TALLY_WEBHOOK_SERVICE='tally-webhook'"):
        Settings.from_env({"TALLY_WEBHOOK_SERVICE": "tally-webhook"})


def test_registrar_body_names_the_service() -> None:
    registrar = WebhookRegistrar(
        cast(Any, None),
        name="tally.dev",
        url="https://0.0.0.0:9443",
        ca_pem=b"CA",
        listen=("0.0.0.0", 9443),
        quotas=list,
        failure_policy="Fail",
        exempt_namespaces=["kube-system"],
        service=ServiceReference("tally-system", "tally-webhook"),
    )
    body = registrar.body(set())
    assert [w["clientConfig"]["service"]["name"] for w in body["webhooks"]] == [
        "tally-webhook",
        "tally-webhook",
        "tally-webhook",
    ]
    assert registrar.target == "service tally-system/tally-webhook:443"


@pytest.mark.parametrize("mutual_tls", [False, True], ids=["tls", "mutual-tls"])
async def test_registrar_registers_when_listening_on_a_wildcard_address(
    tmp_path: Path, mutual_tls: bool
) -> None:
    """In a cluster tally listens on 0.0.0.0 and its certificate names only the Service: the
    readiness check must dial loopback and check a name the certificate holds. With mutual TLS
    the server refuses the check, which has no client certificate, once it has shown its own:
    that still counts as serving."""
    service = ServiceReference("tally-system", "tally-webhook")
    client_ca = ""
    if mutual_tls:
        other = certs.new_material(["client"], datetime.datetime.now(datetime.UTC))
        (tmp_path / "client-ca.crt").write_bytes(other.ca_bundle)
        client_ca = str(tmp_path / "client-ca.crt")
    tls = ServingTLS(
        MemorySource(),
        hosts=service.dns_names,
        policy=certs.Policy(),
        directory=tmp_path / "tls",
        client_ca=client_ca,
    )
    await tls.load()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=tls.context)
    port = server.sockets[0].getsockname()[1]
    applied: list[bool] = []

    class Recording(WebhookRegistrar):
        async def _apply(self) -> None:
            applied.append(True)

    registrar = Recording(
        cast(Any, None),
        name="tally.dev",
        url=f"https://{service.dns_names[0]}:{port}",
        ca_pem=tls.ca_bundle,
        listen=("0.0.0.0", port),
        quotas=list,
        failure_policy="Fail",
        exempt_namespaces=["kube-system"],
        service=service,
        tls_name=service.dns_names[0],
    )
    try:
        registrar.start()
        await asyncio.wait_for(registrar.registered.wait(), timeout=10)
        assert applied == [True]
    finally:
        await registrar.stop(remove=False)
        server.close()
        await server.wait_closed()


async def test_registrar_does_not_register_a_server_it_does_not_trust(tmp_path: Path) -> None:
    """The readiness check verifies the server's certificate against the caBundle: a server
    presenting another CA's certificate is not "serving" (the API server would refuse it)."""
    tls = ServingTLS(
        MemorySource(), hosts=["127.0.0.1"], policy=certs.Policy(), directory=tmp_path / "tls"
    )
    await tls.load()
    server = await asyncio.start_server(
        lambda reader, writer: writer.close(), "127.0.0.1", 0, ssl=tls.context
    )
    port = server.sockets[0].getsockname()[1]
    other = certs.new_material(["127.0.0.1"], datetime.datetime.now(datetime.UTC))

    class Recording(WebhookRegistrar):
        async def _apply(self) -> None:
            raise AssertionError("registered a server whose certificate it does not trust")

    registrar = Recording(
        cast(Any, None),
        name="tally.dev",
        url=f"https://127.0.0.1:{port}",
        ca_pem=other.ca_bundle,
        listen=("127.0.0.1", port),
        quotas=list,
        failure_policy="Fail",
        exempt_namespaces=["kube-system"],
    )
    waiting = asyncio.ensure_future(registrar.registered.wait())
    try:
        registrar.start()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(waiting), timeout=1)
    finally:
        # The shielded wait is ours to end: a pending task destroyed later is logged as an
        # error, in whichever test happens to run then.
        waiting.cancel()
        await registrar.stop(remove=False)
        server.close()
        await server.wait_closed()


async def test_a_stopped_registrar_writes_nothing_more() -> None:
    """A leader that lost its Lease stops its registrar at once but runs on until its process
    ends (quota events, certificate passes): nothing may overwrite the configuration, which may
    already be the new leader's."""
    applied: list[str] = []

    class Recording(WebhookRegistrar):
        async def _apply(self) -> None:
            applied.append(self._ca_pem.decode())
            # As if a quota named count/widgets.example.com when applied: a refresh without
            # it (quotas=list) would apply again.
            self._applied = frozenset({Route(WIDGETS, "", Operation.CREATE)})

    registrar = Recording(
        cast(Any, None),
        name="tally.dev",
        url="https://127.0.0.1:1",
        ca_pem=b"CA1",
        listen=("127.0.0.1", 1),
        quotas=list,
        failure_policy="Fail",
        exempt_namespaces=["kube-system"],
    )
    await registrar.apply()
    await registrar.set_ca_bundle(b"CA2")
    registrar.quotas_changed()
    await asyncio.sleep(REFRESH_DEBOUNCE_S * 3)
    assert ["CA1", "CA2", "CA2"] == applied

    await registrar.stop(remove=False)
    await registrar.set_ca_bundle(b"CA3")
    await registrar.apply()
    registrar.quotas_changed()
    await asyncio.sleep(REFRESH_DEBOUNCE_S * 3)
    assert ["CA1", "CA2", "CA2"] == applied


# -- ClusterQuotas only (the cluster's own quota system is on)


def test_cluster_quotas_only_rules_cover_just_what_quotas_name() -> None:
    evaluators = new_registry().list()
    nothing = count_resources([], evaluators, core_always=False)
    assert (set(), []) == (nothing, webhook_rules(nothing, core_always=False))
    named = count_resources(
        [{"spec": {"hard": {"requests.cpu": "2", "count/configmaps": "3"}}}],
        evaluators,
        core_always=False,
    )
    assert {GroupResource("", "pods"), GroupResource("", "configmaps")} == named
    # One rule per operation set: configmaps are counted (CREATE), pods charged on CREATE and
    # UPDATE (upstream's podEvaluator.Handles), their resize on UPDATE.
    assert [
        (["configmaps"], ["CREATE"]),
        (["pods"], ["CREATE", "UPDATE"]),
        (["pods/resize"], ["UPDATE"]),
    ] == [
        (rule["resources"], rule["operations"]) for rule in webhook_rules(named, core_always=False)
    ]


def test_podset_measures_call_for_podsets_and_their_scale() -> None:
    # kubectl scale writes podsets/scale: without a rule for it, a scale past a PodSet
    # measure's limit would never reach admission.
    registry = new_registry()
    registry.register(PodSetEvaluator())
    evaluators = registry.list()
    named = count_resources(
        [{"spec": {"hard": {"podsets.tally.dev/requests.cpu": "4"}}}],
        evaluators,
        core_always=False,
    )
    assert {PODSETS} == named
    registrar = WebhookRegistrar(
        cast(Any, None),
        name="tally.dev",
        url="https://127.0.0.1:9443",
        ca_pem=b"CA",
        listen=("127.0.0.1", 9443),
        quotas=list,
        evaluators=registry.list,
        failure_policy="Fail",
        exempt_namespaces=["kube-system"],
        core_always=False,
    )
    (quota_webhook,) = [
        w for w in registrar.body(named)["webhooks"] if w["name"] == "quota.tally.dev"
    ]
    assert [
        {
            "apiGroups": ["tally.dev"],
            "apiVersions": ["*"],
            "resources": ["podsets"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        },
        {
            "apiGroups": ["tally.dev"],
            "apiVersions": ["*"],
            "resources": ["podsets/scale"],
            "operations": ["UPDATE"],
            "scope": "Namespaced",
        },
    ] == quota_webhook["rules"]
    # Kinds without handled subresources get none.
    assert [(["configmaps"], ["CREATE"])] == [
        (rule["resources"], rule["operations"])
        for rule in webhook_rules(
            {GroupResource("", "configmaps")}, core_always=False, evaluators=evaluators
        )
    ]


class _SlowApply(WebhookRegistrar):
    """Applies in memory, each apply held at ``gate`` (a PUT in flight)."""

    def __init__(self, quotas: list[dict[str, Any]]) -> None:
        super().__init__(
            cast(Any, None),
            name="tally.dev",
            url="https://127.0.0.1:9443",
            ca_pem=b"CA",
            listen=("127.0.0.1", 9443),
            quotas=lambda: quotas,
            evaluators=new_registry().list,
            failure_policy="Fail",
            exempt_namespaces=["kube-system"],
            core_always=False,
        )
        self.gate = asyncio.Event()
        self.applying = asyncio.Event()

    async def _apply(self) -> None:
        wanted = self._wanted()
        self.applying.set()
        await self.gate.wait()
        self._applied = wanted


async def test_a_quota_change_during_an_apply_is_applied_after_it() -> None:
    # A ClusterQuota naming configmaps arrives while the rules for pods are being written: the
    # running refresh read the quotas before it, so it must look again when it is done.
    quotas: list[dict[str, Any]] = []
    registrar = _SlowApply(quotas)
    registrar._applied = frozenset()  # registered, no rule yet
    assert registrar.rules_current()
    quotas.append({"spec": {"hard": {"pods": "2"}}})
    assert not registrar.rules_current()  # and a refresh is on its way
    await asyncio.wait_for(registrar.applying.wait(), 5)
    quotas.append({"spec": {"hard": {"configmaps": "2"}}})
    registrar.quotas_changed()
    registrar.applying.clear()
    registrar.gate.set()
    assert registrar._refresh is not None
    await asyncio.wait_for(registrar._refresh, 5)
    pods, configmaps = GroupResource("", "pods"), GroupResource("", "configmaps")
    assert {
        Route(pods, "", Operation.CREATE),
        Route(pods, "", Operation.UPDATE),
        Route(pods, "resize", Operation.UPDATE),
        Route(configmaps, "", Operation.CREATE),
    } == registrar._applied
    assert registrar.rules_current()


def test_rules_are_not_current_before_registration() -> None:
    registrar = _SlowApply([])
    assert not registrar.rules_current()  # nothing applied yet: no rule sends anything
    assert registrar._refresh is None  # the registration itself applies them


# -- rules as narrow as the evaluators: what each kind's evaluator handles, and nothing more

STORAGE = "example.com/storage-gb"
DEPLOYMENTS = GroupResource("apps", "deployments")
PVCS = GroupResource("", "persistentvolumeclaims")
PROBED_SUBRESOURCES = (
    "",
    *("status", "scale", "resize", "binding", "eviction", "ephemeralcontainers"),
    *("exec", "attach", "log", "portforward", "proxy", "token", "approval"),
)
"""The object itself and the subresources the API serves for namespaced kinds."""
_OBJECTS: list[dict[str, Any]] = [
    {"metadata": {"name": "x", "namespace": "team-a"}, "spec": {}},
    # A pod whose spec says it is Terminating (upstream IsTerminating: activeDeadlineSeconds
    # set and >= 0): an update into or out of it is what the pod evaluator handles.
    {"metadata": {"name": "x", "namespace": "team-a"}, "spec": {"activeDeadlineSeconds": 30}},
]


def registered() -> Registry:
    """What the runtime registers: the core evaluators, PodSets', and a measured kind's."""
    registry = new_registry()
    registry.register(PodSetEvaluator())
    resource = {"group": WIDGETS.group, "resource": WIDGETS.resource}
    measure = compile_measure({"name": STORAGE, "resource": resource, "expression": "1"})
    registry.register(MeasuredEvaluator(WIDGETS, [measure]))
    return registry


def registered_evaluators() -> list[Evaluator]:
    return registered().list()


def can_handle(evaluator: Evaluator, operation: Operation, subresource: str) -> bool:
    """Whether ``evaluator.handles`` says yes to some request of that operation and
    subresource, as admission would ask it: a CREATE has no old object, an UPDATE both."""
    if operation is Operation.CREATE:
        requests = [(None, new) for new in _OBJECTS]
    else:
        requests = [(old, new) for old in _OBJECTS for new in _OBJECTS]
    return any(evaluator.handles(operation, subresource, old, new) for old, new in requests)


def _matches(pattern: str, path: str) -> bool:
    """The API server's resource matching in a rule: ``*`` is every resource but no
    subresource, ``pods/*`` every subresource of pods, ``*/*`` everything."""
    resource, _, subresource = path.partition("/")
    pattern_resource, slash, pattern_subresource = pattern.partition("/")
    if not slash:
        return not subresource and pattern in ("*", resource)
    return (
        bool(subresource)
        and pattern_resource in ("*", resource)
        and pattern_subresource in ("*", subresource)
    )


def sends(
    rules: list[dict[str, Any]], gr: GroupResource, subresource: str, operation: Operation
) -> bool:
    """Whether a request matches one of ``rules`` (and so reaches tally)."""
    path = f"{gr.resource}/{subresource}" if subresource else gr.resource
    return any(
        ({gr.group, "*"} & set(rule["apiGroups"]))
        and ({str(operation), "*"} & set(rule["operations"]))
        and any(_matches(pattern, path) for pattern in rule["resources"])
        for rule in rules
    )


def test_every_request_an_evaluator_handles_is_sent() -> None:
    registry = registered()
    # Every registered kind, and a count/ kind without an evaluator of its own.
    kinds = {e.group_resource for e in registry.list()} | {DEPLOYMENTS}
    rules = webhook_rules(kinds, evaluators=registry.list())
    checked = 0
    for gr in sorted(kinds):
        evaluator = registry.get_or_count(gr)
        assert evaluator is not None
        for subresource in PROBED_SUBRESOURCES:
            if subresource in NEVER_ROUTED_SUBRESOURCES:
                continue
            for operation in (Operation.CREATE, Operation.UPDATE):
                if can_handle(evaluator, operation, subresource):
                    checked += 1
                    assert sends(rules, gr, subresource, operation), (gr, subresource, operation)
    # pods 3, services 2, PVCs 2, claims 2, podsets 3, widgets 2, and the CREATE of the four
    # legacy-counted core kinds and deployments.
    assert 19 == checked


def test_nothing_is_sent_that_no_evaluator_handles() -> None:
    registry = registered()
    kinds = {e.group_resource for e in registry.list()} | {DEPLOYMENTS}
    for rule in webhook_rules(kinds, evaluators=registry.list()):
        (group,) = rule["apiGroups"]
        for path in rule["resources"]:
            resource, _, subresource = path.partition("/")
            evaluator = registry.get_or_count(GroupResource(group, resource))
            assert evaluator is not None
            for operation in rule["operations"]:
                assert can_handle(evaluator, Operation(operation), subresource), (path, operation)


@pytest.mark.parametrize(
    "gr",
    [
        *(GroupResource("", r) for r in ("configmaps", "secrets")),
        *(GroupResource("", r) for r in ("replicationcontrollers", "resourcequotas")),
        GroupResource("", "endpoints"),
        DEPLOYMENTS,
        GroupResource("batch", "jobs"),
    ],
    ids=str,
)
def test_counted_kinds_are_sent_creations_only(gr: GroupResource) -> None:
    # Upstream's objectCountEvaluator.Handles (generic/evaluator.go): operation == Create. An
    # update (a 700 KiB Secret, Helm's release Secrets) never reaches tally.
    rules = webhook_rules({gr}, evaluators=registered_evaluators())
    assert sends(rules, gr, "", Operation.CREATE)
    assert not sends(rules, gr, "", Operation.UPDATE)


def test_default_rules_are_the_core_evaluators() -> None:
    # podEvaluator.Handles: CREATE, UPDATE (Terminating-ness), resize UPDATE; serviceEvaluator
    # and pvcEvaluator: CREATE and UPDATE; the legacy counted kinds: CREATE (pods.go,
    # services.go, persistent_volume_claims.go, generic/evaluator.go).
    core = {"apiGroups": [""], "apiVersions": ["v1"], "scope": "Namespaced"}
    assert [
        core | {"resources": ["configmaps", "replicationcontrollers", "resourcequotas", "secrets"],
                "operations": ["CREATE"]},
        core | {"resources": ["persistentvolumeclaims", "pods", "services"],
                "operations": ["CREATE", "UPDATE"]},
        core | {"resources": ["pods/resize"], "operations": ["UPDATE"]},
    ] == webhook_rules(())  # fmt: skip


def test_status_writes_are_never_sent() -> None:
    # The PVC evaluator takes a claim's status writes (upstream's Handles looks at the
    # operation only), but a status write is a controller's report: it is never sent.
    assert can_handle(PersistentVolumeClaimEvaluator(), Operation.UPDATE, "status")
    rules = webhook_rules((), evaluators=registered_evaluators())
    assert not sends(rules, PVCS, "status", Operation.UPDATE)
    assert not sends(rules, GroupResource("", "resourcequotas"), "status", Operation.UPDATE)


def test_a_kind_admission_ignores_gets_no_rule() -> None:
    # count/events names a kind upstream's registry ignores: admission never charges it.
    events = GroupResource("", "events")
    assert {events} == count_resources([quota({"count/events": "10"})])
    assert not sends(webhook_rules({events}), events, "", Operation.CREATE)


class _Recording(WebhookRegistrar):
    """Writes the configuration into ``written`` instead of the API."""

    def __init__(self, **overrides: Any) -> None:
        arguments: dict[str, Any] = {
            "name": "tally.dev",
            "url": "https://127.0.0.1:9443",
            "ca_pem": b"CA",
            "listen": ("127.0.0.1", 9443),
            "quotas": list,
            "failure_policy": "Fail",
            "exempt_namespaces": ["kube-system"],
        }
        super().__init__(cast(Any, None), **(arguments | overrides))
        self.written: list[dict[str, Any]] = []

    async def _write(self, body: dict[str, Any]) -> None:
        self.written.append(body)


async def test_a_counted_kind_that_gets_measures_is_sent_its_updates() -> None:
    # A ClusterQuota counting widgets (count/) is joined by a measure over them: the kinds
    # named are the same, but an update of a widget can now grow what it is charged.
    evaluators = new_registry().list()
    registrar = _Recording(
        quotas=lambda: [quota({"count/widgets.example.com": "5", STORAGE: "50"})],
        evaluators=lambda: evaluators,
    )
    await registrar.apply()
    rules = registrar.written[-1]["webhooks"][0]["rules"]
    assert not sends(rules, WIDGETS, "", Operation.UPDATE)
    assert registrar.rules_current()
    resource = {"group": WIDGETS.group, "resource": WIDGETS.resource}
    measure = compile_measure({"name": STORAGE, "resource": resource, "expression": "1"})
    evaluators.append(MeasuredEvaluator(WIDGETS, [measure]))
    assert not registrar.rules_current()  # and a refresh is on its way
    assert registrar._refresh is not None
    await asyncio.wait_for(registrar._refresh, 5)
    rules = registrar.written[-1]["webhooks"][0]["rules"]
    assert sends(rules, WIDGETS, "", Operation.CREATE)
    assert sends(rules, WIDGETS, "", Operation.UPDATE)
    assert registrar.rules_current()
    await registrar.stop(remove=False)


async def test_creations_are_charged_where_creations_are_sent() -> None:
    now = [100.0]
    registrar = _Recording(
        quotas=lambda: [quota({"count/events": "1", "count/deployments.apps": "1"})],
        evaluators=new_registry().list,
        clock=lambda: now[0],
    )
    await registrar.apply()
    now[0] += RULES_SETTLE_S
    # Sent creations only, and charged: the quota controller need not recalculate on them.
    assert registrar.charges_creations(GroupResource("", "secrets"))
    assert registrar.charges_creations(DEPLOYMENTS)
    assert registrar.charges_creations(GroupResource("", "pods"))
    # Not sent at all: nobody charges an event's creation.
    assert not registrar.charges_creations(GroupResource("", "events"))


# -- which namespaces the webhooks see


def test_watched_namespaces_narrow_the_namespaced_webhooks() -> None:
    config = validating_webhook_configuration(
        name="tally.dev",
        url="https://127.0.0.1:9443",
        ca_bundle="Q0E=",
        rules=webhook_rules(()),
        exempt_namespaces=["kube-system", "tally-system"],
        watched_namespaces=["team-b", "team-a", "tally-system"],
    )
    quotas, podsets, cluster_quotas = config["webhooks"]
    # tally's own namespace stays exempt even when watched.
    watched = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]
    }
    assert watched == quotas["namespaceSelector"]
    assert watched == podsets["namespaceSelector"]
    # Cluster-scoped ClusterQuotas: the selector is never applied; it stays the exempt one.
    assert [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "tally-system"],
        }
    ] == cluster_quotas["namespaceSelector"]["matchExpressions"]


def test_without_watched_namespaces_all_but_the_exempt_are_seen() -> None:
    assert {
        "matchExpressions": [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": ["cert-manager", "kube-system", "tally-system"],
            }
        ]
    } == namespace_selector(["tally-system", "kube-system", "cert-manager", "kube-system"])
    # NotIn needs values: with nothing exempt, the empty selector selects every namespace.
    assert {} == namespace_selector([])


def test_a_selector_that_would_select_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="every namespace tally manages is exempt"):
        namespace_selector(["kube-system", "team-a"], ["team-a"])


def test_registrar_passes_exempt_and_watched_namespaces() -> None:
    registrar = _Recording(
        exempt_namespaces=["kube-system", "tally-system"], watched_namespaces=["team-a"]
    )
    quotas, podsets, _ = registrar.body(set())["webhooks"]
    assert ["team-a"] == quotas["namespaceSelector"]["matchExpressions"][0]["values"]
    assert ["team-a"] == podsets["namespaceSelector"]["matchExpressions"][0]["values"]
