"""Operator settings, read once at start-up from ``TALLY_*`` environment variables.

A pydantic model because this is a boundary: values arrive as strings from a Deployment or a
shell, and a typo or an absurd value must stop the operator with a message naming the variable,
not surface later as odd behaviour. Kopf's own settings (watching, peering) stay in the Kopf
wiring; these are tally's.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Mapping
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tally.builtin_quota.decision import probe_namespace
from tally.machinery import leaderelection
from tally.machinery.validation import is_dns1123_label, is_dns1123_subdomain
from tally.webhook import limits
from tally.webhook.certs import Policy
from tally.webhook.configuration import (
    DEFAULT_EXEMPT_NAMESPACES,
    ServiceReference,
    parse_service_reference,
)

ENV_PREFIX: Final = "TALLY_"
DEFAULT_LEASE_NAMESPACE: Final = "kube-system"
"""Where the Lease lives when neither its namespace nor ``TALLY_NAMESPACE`` is set (like the
built-in quota probe, and kube-controller-manager's own leases)."""


def parse_object_reference(text: str) -> tuple[str, str]:
    """``<namespace>/<name>`` of a namespaced object, both DNS-1123 names."""
    namespace, slash, name = text.partition("/")
    if not slash:
        raise ValueError(f"{text!r} is not <namespace>/<name>")
    problems = [
        *(f"namespace {m}" for m in is_dns1123_label(namespace)),
        *(f"name {m}" for m in is_dns1123_subdomain(name)),
    ]
    if problems:
        raise ValueError(f"{text!r} is not <namespace>/<name>: {'; '.join(problems)}")
    return namespace, name


def is_loopback(host: str) -> bool:
    """Whether a server bound to ``host`` is reachable from this host only: ``localhost``,
    127.0.0.0/8, ``::1`` (and 127.0.0.0/8 written as an IPv4-mapped IPv6 address). Anything
    else, an unspecified address or a name included, may be reachable from elsewhere."""
    if host.strip().lower().rstrip(".") == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip())
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class SettingsError(ValueError):
    """An invalid setting; the message names the environment variable."""


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    resync_period: float = Field(default=300.0, gt=0, le=86400)
    """``TALLY_RESYNC_PERIOD``: seconds between full recalculations of every quota (upstream
    ``--resource-quota-sync-period``, 5 min)."""
    namespaces: str = ""
    """``TALLY_NAMESPACES``: comma-separated namespaces tally manages (quotas, usage, admission,
    PodSets); empty means all. Run Kopf with the same ``--namespace`` flags so that it watches
    no more than that."""
    charge_confirm_timeout: float = Field(default=5.0, gt=0, le=300)
    """``TALLY_CHARGE_CONFIRM_TIMEOUT``: seconds a charge admission wrote into a quota waits for
    its object to appear in tally's caches before it is released and the quota recalculated
    (a request refused after tally allowed it, by another webhook or the API server). Must
    exceed the time any successful create takes from tally's answer to its watch event,
    including the other validating webhooks' latency (see ``tally.charges``)."""
    heap_trim_period: float = Field(default=60.0, ge=0, le=86400)
    """``TALLY_HEAP_TRIM_PERIOD``: seconds between returns of freed heap memory to the
    operating system (glibc's ``malloc_trim``; see :mod:`tally.app.heap`); 0 turns it off."""
    api_connections: int = Field(default=16, ge=1, le=1000)
    """``TALLY_API_CONNECTIONS``: most requests tally has in flight to the API server at once
    (each holds a TLS connection of ~320 KiB that stays open until its pool is renewed; see
    :func:`tally.kube.rest.make_api_client`). Admission, the Lease and the ``count/`` watches
    have connections of their own, outside this limit. 16 keeps the PodSet controller's
    unthrottled bursts near the API server's own pace (``bench/podset.py``); 8 halves the
    connections a new leader's first syncs open, and slows those bursts."""
    api_pool_renewal_period: float = Field(default=60.0, ge=0, le=86400)
    """``TALLY_API_POOL_RENEWAL_PERIOD``: seconds between looks at tally's API connection
    pools; one that held connections the period did not need is renewed, which gives back what
    a burst opened (aiohttp's pool never lets a connection in steady use idle out; see
    :class:`tally.kube.rest.PoolRenewal`). 0 turns it off: each pool then keeps what its
    largest burst opened."""
    workers: int = Field(default=5, ge=1, le=100)
    """``TALLY_WORKERS``: workers per quota controller queue (upstream
    ``--concurrent-resource-quota-syncs``)."""
    missing_usage_workers: int = Field(default=20, ge=1, le=200)
    """``TALLY_MISSING_USAGE_WORKERS``: the ResourceQuota controller's workers for quotas
    without usage (every quota at a cold start, new quotas); see
    ``tally.resourcequota.controller.DEFAULT_MISSING_USAGE_WORKERS``."""
    metrics_addr: str = "0.0.0.0"
    """``TALLY_METRICS_ADDR``: where ``/metrics`` listens."""
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    """``TALLY_METRICS_PORT``: ``/metrics`` port; 0 turns the endpoint off."""
    readiness_addr: str = "0.0.0.0"
    """``TALLY_READINESS_ADDR``: where ``/readyz`` listens (plain HTTP: it tells only whether
    this replica is ready, and why not)."""
    readiness_port: int = Field(default=8082, ge=0, le=65535)
    """``TALLY_READINESS_PORT``: ``/readyz`` port, for the kubelet's readiness probe; 0 turns
    the endpoint off (the loop's lag is still sampled for the metric)."""
    readiness_max_loop_lag: float = Field(default=0.1, gt=0, le=60)
    """``TALLY_READINESS_MAX_LOOP_LAG``: seconds the event loop may run late and the replica
    still count as answering promptly (see :mod:`tally.app.readiness`)."""
    readiness_window: float = Field(default=5.0, gt=0, le=3600)
    """``TALLY_READINESS_WINDOW``: seconds in a row, since the webhook began to serve, that
    the loop must stay within ``TALLY_READINESS_MAX_LOOP_LAG`` before the replica is ready."""
    readiness_timeout: float = Field(default=300.0, gt=0, le=86400)
    """``TALLY_READINESS_TIMEOUT``: the replica reports ready anyway (with a warning) once its
    start-up work made no progress for this many seconds, or once its loop was not prompt for a
    whole window in this many seconds after that work was done (:mod:`tally.app.readiness`)."""
    metrics_auth: Literal["auto", "kubernetes", "none"] = "auto"
    """``TALLY_METRICS_AUTH``: who may read ``/metrics`` (quota names, namespaces, every
    tenant's usage). ``kubernetes``: HTTPS, and only a bearer token the API server
    authenticates (TokenReview) of a user it allows ``get`` on the non-resource URL
    ``/metrics`` (SubjectAccessReview), controller-runtime's secure metrics
    (:mod:`tally.machinery.delegating_auth`); ``none``: plain HTTP to anyone who reaches the
    port (a warning at start-up unless ``TALLY_METRICS_ADDR`` is a loopback address);
    ``auto``: ``none`` on a loopback address, which only this host reaches (local development,
    the test suites), else ``kubernetes``. See :attr:`metrics_auth_mode`."""

    webhook_enabled: bool = True
    """``TALLY_WEBHOOK_ENABLED``: serve and register the quota admission webhook."""
    webhook_addr: str = "127.0.0.1"
    """``TALLY_WEBHOOK_ADDR``: where the webhook server listens."""
    webhook_port: int = Field(default=9443, ge=1, le=65535)
    """``TALLY_WEBHOOK_PORT``: the webhook server's port."""
    webhook_host: str = ""
    """``TALLY_WEBHOOK_HOST``: the host the API server dials (URL and certificate SAN);
    default: the listening address."""
    webhook_url_port: int | None = Field(default=None, ge=1, le=65535)
    """``TALLY_WEBHOOK_URL_PORT``: the port in the URL the API server dials, when what it
    reaches is not tally itself but something in front of the replicas (a load balancer, a
    node port) listening elsewhere; default: ``TALLY_WEBHOOK_PORT``."""
    webhook_service: str = ""
    """``TALLY_WEBHOOK_SERVICE``: ``<namespace>/<name>[:<port>]`` of the Service in front of the
    webhook server (port 443 by default). Set in a cluster: the webhook configuration then names
    the Service instead of a URL, and the serving certificate's SANs include
    ``<name>.<namespace>.svc`` (and ``.svc.cluster.local``)."""
    webhook_cert_dir: str = ""
    """``TALLY_WEBHOOK_CERT_DIR``: where the serving pair (and the CA bundle) the webhook server
    loads are written; default: a private temporary directory."""
    webhook_cert_secret: str = ""
    """``TALLY_WEBHOOK_CERT_SECRET``: ``<namespace>/<name>`` of a ``kubernetes.io/tls`` Secret
    that keeps tally's CA and serving pair across restarts: read at start-up, created or
    renewed by tally, re-read every ``TALLY_WEBHOOK_CERT_CHECK_PERIOD`` and when it changes.
    Empty: a new CA and pair in memory at every start (local development)."""
    webhook_cert_mount: str = ""
    """``TALLY_WEBHOOK_CERT_MOUNT``: a directory with ``tls.crt``, ``tls.key`` and ``ca.crt``
    made by someone else (a mounted cert-manager Secret): served as they are, ``ca.crt`` as the
    caBundle, re-read every ``TALLY_WEBHOOK_CERT_CHECK_PERIOD``; tally never writes them."""
    webhook_cert_validity: float = Field(default=365 * 86400.0, ge=10, le=10 * 365 * 86400.0)
    """``TALLY_WEBHOOK_CERT_VALIDITY``: seconds a serving certificate tally makes is valid."""
    webhook_ca_validity: float = Field(default=5 * 365 * 86400.0, ge=10, le=30 * 365 * 86400.0)
    """``TALLY_WEBHOOK_CA_VALIDITY``: seconds the CA tally makes is valid (≥ the serving
    certificate's validity)."""
    webhook_cert_renew_fraction: float = Field(default=1 / 3, ge=0.05, le=0.9)
    """``TALLY_WEBHOOK_CERT_RENEW_FRACTION``: renew a certificate (serving or CA) once less than
    this share of its validity is left."""
    webhook_ca_overlap: float = Field(default=3600.0, ge=0, le=30 * 86400.0)
    """``TALLY_WEBHOOK_CA_OVERLAP``: seconds a new CA is in the caBundle before the serving
    certificate moves to it (time for every API server to trust it)."""
    webhook_cert_check_period: float = Field(default=60.0, ge=1, le=86400)
    """``TALLY_WEBHOOK_CERT_CHECK_PERIOD``: seconds between re-reads of the Secret or mounted
    files (renewals due sooner happen sooner)."""
    webhook_client_ca: str = ""
    """``TALLY_WEBHOOK_CLIENT_CA``: path of a PEM CA bundle. When set, the webhook server
    requires a client certificate signed by it (mutual TLS): the API server's, configured in its
    AdmissionConfiguration. Use a CA that signs nothing else."""
    webhook_failure_policy: Literal["Fail", "Ignore"] = "Fail"
    """``TALLY_WEBHOOK_FAILURE_POLICY``: what the API server does when tally cannot answer."""
    webhook_config_name: str = Field(default="tally.dev", min_length=1)
    """``TALLY_WEBHOOK_CONFIG_NAME``: the ValidatingWebhookConfiguration tally manages."""
    webhook_remove_on_exit: bool = True
    """``TALLY_WEBHOOK_REMOVE_ON_EXIT``: delete the configuration on a graceful exit. Right for
    local development (a dead fail-closed webhook blocks every pod create); set false in a
    cluster, where refusing creates while tally is down is what keeps quotas limits."""
    webhook_max_body_bytes: int = Field(default=limits.MAX_BODY_BYTES, ge=64 * 1024, le=1 << 30)
    """``TALLY_WEBHOOK_MAX_BODY_BYTES``: largest review body the webhook server reads; past it
    a 413 naming the limit (7 MiB: an UPDATE's two objects of etcd's 1.5 MiB each, as JSON, and
    the envelope; see :mod:`tally.webhook.limits`)."""
    webhook_body_budget_bytes: int = Field(
        default=limits.BODY_BUDGET_BYTES, ge=64 * 1024, le=1 << 34
    )
    """``TALLY_WEBHOOK_BODY_BUDGET_BYTES``: body bytes of all reviews being read, parsed or
    judged at once; past it a 429 (the API server sends the review again a second later). At
    least ``TALLY_WEBHOOK_MAX_BODY_BYTES``; bounds the memory reviews hold (the formula in
    :mod:`tally.webhook.limits`)."""
    webhook_max_reviews_in_flight: int = Field(
        default=limits.MAX_REVIEWS_IN_FLIGHT, ge=1, le=100_000
    )
    """``TALLY_WEBHOOK_MAX_REVIEWS_IN_FLIGHT``: reviews being read, parsed or judged at once;
    past it a 429 (200: kube-apiserver's default ``--max-mutating-requests-inflight``)."""
    webhook_max_connections: int = Field(default=limits.MAX_CONNECTIONS, ge=1, le=100_000)
    """``TALLY_WEBHOOK_MAX_CONNECTIONS``: open webhook connections, TLS handshakes included
    (~270 KiB each); past it the longest idle one is closed, or the new one when every one is
    serving a request."""
    webhook_tls_handshake_timeout: float = Field(
        default=limits.TLS_HANDSHAKE_TIMEOUT_S, gt=0, le=300
    )
    """``TALLY_WEBHOOK_TLS_HANDSHAKE_TIMEOUT``: seconds from a connection's accept to the end
    of its TLS handshake."""
    webhook_header_timeout: float = Field(default=limits.HEADER_TIMEOUT_S, gt=0, le=300)
    """``TALLY_WEBHOOK_HEADER_TIMEOUT``: seconds from a request's first byte to the end of its
    head."""
    webhook_body_timeout: float = Field(default=limits.BODY_TIMEOUT_S, gt=0, le=300)
    """``TALLY_WEBHOOK_BODY_TIMEOUT``: seconds from the end of a request's head to the end of
    its body (then a 408), and to write its response."""
    webhook_keepalive_timeout: float = Field(default=limits.KEEPALIVE_TIMEOUT_S, gt=0, le=3600)
    """``TALLY_WEBHOOK_KEEPALIVE_TIMEOUT``: seconds a connection may wait for its next request
    (or its first). Keep it above the 90 s the API server keeps an idle webhook connection, so
    that the API server always closes first (a server closing under a request it is writing
    fails that request)."""
    namespace: str = ""
    """``TALLY_NAMESPACE``: the operator's own namespace, always exempt from the webhook (so
    tally's own pods can always be created). The start-up probe for the built-in quota system
    runs there (in kube-system when unset)."""
    exempt_namespaces: str = ",".join(DEFAULT_EXEMPT_NAMESPACES)
    """``TALLY_EXEMPT_NAMESPACES``: comma-separated namespaces the quota and PodSet webhooks
    never see (besides ``TALLY_NAMESPACE``): nothing there is judged or charged, and nothing
    there fails while no tally replica answers. For what the cluster and tally need to run: the
    add-ons (the CNI and other node agents, cert-manager) must be able to create pods while
    tally is down, or a new node never becomes Ready, for tally's pods either. Empty: only
    ``TALLY_NAMESPACE``; kube-system must stay exempt while ``TALLY_NAMESPACE`` is unset (the
    start-up probe runs there)."""
    allow_builtin_quota: bool = False
    """``TALLY_ALLOW_BUILTIN_QUOTA``: start even when the start-up probe sees upstream's own
    quota admission plugin or controller on (logged as a warning). Off: tally refuses to start
    then (see :mod:`tally.builtin_quota.decision`)."""
    leader_election: bool = False
    """``TALLY_LEADER_ELECTION``: run the controllers (quota usage, PodSet, the webhook
    configuration's writes) only while holding a Lease, so that several replicas can run;
    the webhook serves on every replica either way (:mod:`tally.machinery.leaderelection`). Off:
    this process runs everything (local development, the e2e tests, one replica)."""
    leader_election_lease: str = Field(default="tally", min_length=1, max_length=253)
    """``TALLY_LEADER_ELECTION_LEASE``: the Lease's name."""
    leader_election_namespace: str = ""
    """``TALLY_LEADER_ELECTION_NAMESPACE``: the Lease's namespace; default ``TALLY_NAMESPACE``
    (else kube-system)."""
    leader_election_lease_duration: int = Field(
        default=leaderelection.DEFAULT_LEASE_DURATION_S, ge=1, le=3600
    )
    """``TALLY_LEADER_ELECTION_LEASE_DURATION``: seconds a candidate waits without seeing the
    lease renewed before taking it over (``--leader-elect-lease-duration``, 15 s); whole
    seconds, as the Lease stores it."""
    leader_election_renew_deadline: float = Field(
        default=leaderelection.DEFAULT_RENEW_DEADLINE_S, gt=0, le=3600
    )
    """``TALLY_LEADER_ELECTION_RENEW_DEADLINE``: seconds the leader keeps trying to renew
    before it stops leading and exits (``--leader-elect-renew-deadline``, 10 s)."""
    leader_election_retry_period: float = Field(
        default=leaderelection.DEFAULT_RETRY_PERIOD_S, gt=0, le=3600
    )
    """``TALLY_LEADER_ELECTION_RETRY_PERIOD``: seconds between attempts to acquire or renew
    (``--leader-elect-retry-period``, 2 s)."""

    admission_workers: int = Field(default=5, ge=1, le=100)
    """``TALLY_ADMISSION_WORKERS``: lanes evaluated at once (a namespace, or every namespace a
    ClusterQuota selects; upstream: 5 namespaces)."""
    admission_config: str = ""
    """``TALLY_ADMISSION_CONFIG``: path of a ``ResourceQuotaConfiguration`` (LimitedResources)."""

    @field_validator("namespaces", "namespace", "exempt_namespaces")
    @classmethod
    def _valid_namespaces(cls, value: str) -> str:
        for name in (part.strip() for part in value.split(",")):
            problems = is_dns1123_label(name) if name else []
            if problems:
                raise ValueError(f"{name!r} is not a valid namespace name: {'; '.join(problems)}")
        return value

    @field_validator("leader_election_namespace")
    @classmethod
    def _valid_lease_namespace(cls, value: str) -> str:
        problems = is_dns1123_label(value) if value else []
        if problems:
            raise ValueError(f"{value!r} is not a valid namespace name: {'; '.join(problems)}")
        return value

    @field_validator("leader_election_lease")
    @classmethod
    def _valid_lease_name(cls, value: str) -> str:
        problems = is_dns1123_subdomain(value)
        if problems:
            raise ValueError(f"{value!r} is not a valid Lease name: {'; '.join(problems)}")
        return value

    @model_validator(mode="after")
    def _election_durations_work_together(self) -> Settings:
        problem = leaderelection.config_problem(
            self.leader_election_lease_duration,
            self.leader_election_renew_deadline,
            self.leader_election_retry_period,
        )
        if problem:
            # A model-level error has no field to name: the message names all three.
            raise ValueError(
                f"{ENV_PREFIX}LEADER_ELECTION_LEASE_DURATION="
                f"{self.leader_election_lease_duration}, "
                f"{ENV_PREFIX}LEADER_ELECTION_RENEW_DEADLINE="
                f"{self.leader_election_renew_deadline:g}, "
                f"{ENV_PREFIX}LEADER_ELECTION_RETRY_PERIOD="
                f"{self.leader_election_retry_period:g}: {problem} (client-go's rules)"
            )
        return self

    @model_validator(mode="after")
    def _readiness_window_within_timeout(self) -> Settings:
        if self.readiness_window > self.readiness_timeout:
            raise ValueError(
                f"{ENV_PREFIX}READINESS_WINDOW={self.readiness_window:g} exceeds "
                f"{ENV_PREFIX}READINESS_TIMEOUT={self.readiness_timeout:g}: the replica would "
                "report ready at the timeout before any window could pass"
            )
        return self

    @property
    def metrics_auth_mode(self) -> Literal["kubernetes", "none"]:
        """``TALLY_METRICS_AUTH`` with ``auto`` resolved by ``TALLY_METRICS_ADDR``."""
        if self.metrics_auth == "kubernetes":
            return "kubernetes"
        if self.metrics_auth == "none":
            return "none"
        return "none" if is_loopback(self.metrics_addr) else "kubernetes"

    @property
    def lease_namespace(self) -> str:
        """Where the leader election's Lease lives."""
        return self.leader_election_namespace or self.namespace or DEFAULT_LEASE_NAMESPACE

    @property
    def election_config(self) -> leaderelection.ElectionConfig:
        return leaderelection.ElectionConfig(
            self.leader_election_lease_duration,
            self.leader_election_renew_deadline,
            self.leader_election_retry_period,
        )

    @field_validator("webhook_service")
    @classmethod
    def _valid_webhook_service(cls, value: str) -> str:
        if value:
            parse_service_reference(value)
        return value

    @field_validator("webhook_cert_secret")
    @classmethod
    def _valid_webhook_cert_secret(cls, value: str) -> str:
        if value:
            parse_object_reference(value)
        return value

    @model_validator(mode="after")
    def _consistent_certificate_settings(self) -> Settings:
        if self.webhook_cert_secret and self.webhook_cert_mount:
            raise ValueError(
                "TALLY_WEBHOOK_CERT_SECRET and TALLY_WEBHOOK_CERT_MOUNT exclude each other: "
                "tally either keeps its certificate in a Secret or serves mounted files"
            )
        if self.webhook_ca_validity < self.webhook_cert_validity:
            raise ValueError(
                "TALLY_WEBHOOK_CA_VALIDITY must be at least TALLY_WEBHOOK_CERT_VALIDITY "
                f"({self.webhook_ca_validity:g} < {self.webhook_cert_validity:g})"
            )
        renew_window = self.webhook_ca_validity * self.webhook_cert_renew_fraction
        if self.webhook_ca_overlap >= renew_window:
            raise ValueError(
                f"TALLY_WEBHOOK_CA_OVERLAP={self.webhook_ca_overlap:g} must be shorter than the "
                f"CA's renewal window ({renew_window:g} s: TALLY_WEBHOOK_CA_VALIDITY times "
                "TALLY_WEBHOOK_CERT_RENEW_FRACTION), or the old CA ends before the new one "
                "is trusted"
            )
        secret = self.webhook_cert_secret_ref
        exempt = self.webhook_exempt_namespaces
        if secret is not None and secret[0] not in exempt:
            # tally writes the Secret through the API server, which asks tally's own webhook
            # about Secret writes in every other namespace: with a broken certificate, tally
            # could not write the one that repairs it.
            raise ValueError(
                f"TALLY_WEBHOOK_CERT_SECRET={self.webhook_cert_secret!r}: the Secret must be "
                f"in a namespace tally's webhook exempts ({', '.join(exempt)}; set "
                "TALLY_NAMESPACE or TALLY_EXEMPT_NAMESPACES), or a broken certificate could "
                "not be replaced"
            )
        return self

    @model_validator(mode="after")
    def _exempt_namespaces_work(self) -> Settings:
        exempt = self.webhook_exempt_namespaces
        probed = probe_namespace(self.namespace)
        if probed not in exempt:
            # The built-in quota probe creates a quota there: a tally webhook (an earlier
            # run's, dead or alive) must not stand between it and the built-in plugin.
            raise ValueError(
                f"TALLY_EXEMPT_NAMESPACES={self.exempt_namespaces!r}: {probed} must stay "
                "exempt while TALLY_NAMESPACE is unset (the start-up probe runs there)"
            )
        watched = self.watched_namespaces
        if watched and watched <= set(exempt):
            raise ValueError(
                f"TALLY_NAMESPACES={self.namespaces!r}: every namespace tally manages is exempt "
                f"from its webhook ({', '.join(exempt)}), so nothing would be judged"
            )
        return self

    @property
    def webhook_exempt_namespaces(self) -> tuple[str, ...]:
        """The namespaces the quota and PodSet webhooks skip: ``TALLY_EXEMPT_NAMESPACES`` and
        ``TALLY_NAMESPACE``, sorted."""
        names = {p.strip() for p in self.exempt_namespaces.split(",") if p.strip()}
        if self.namespace:
            names.add(self.namespace)
        return tuple(sorted(names))

    @property
    def webhook_cert_secret_ref(self) -> tuple[str, str] | None:
        """(namespace, name) of the certificate Secret; None: none."""
        return (
            parse_object_reference(self.webhook_cert_secret) if self.webhook_cert_secret else None
        )

    @property
    def certificate_policy(self) -> Policy:
        """How long what tally makes is valid, and when it is renewed."""
        return Policy(
            validity=datetime.timedelta(seconds=self.webhook_cert_validity),
            ca_validity=datetime.timedelta(seconds=self.webhook_ca_validity),
            renew_fraction=self.webhook_cert_renew_fraction,
            ca_overlap=datetime.timedelta(seconds=self.webhook_ca_overlap),
        )

    @model_validator(mode="after")
    def _webhook_budget_holds_a_body(self) -> Settings:
        if self.webhook_body_budget_bytes < self.webhook_max_body_bytes:
            raise ValueError(
                f"TALLY_WEBHOOK_BODY_BUDGET_BYTES={self.webhook_body_budget_bytes} must be at "
                f"least TALLY_WEBHOOK_MAX_BODY_BYTES={self.webhook_max_body_bytes}, or a body "
                "of the largest size could never be read"
            )
        return self

    @property
    def webhook_limits(self) -> limits.WebhookLimits:
        """What the webhook server may hold, and how long its peers may take."""
        return limits.WebhookLimits(
            max_body_bytes=self.webhook_max_body_bytes,
            body_budget_bytes=self.webhook_body_budget_bytes,
            max_reviews_in_flight=self.webhook_max_reviews_in_flight,
            max_connections=self.webhook_max_connections,
            tls_handshake_timeout=self.webhook_tls_handshake_timeout,
            header_timeout=self.webhook_header_timeout,
            body_timeout=self.webhook_body_timeout,
            keepalive_timeout=self.webhook_keepalive_timeout,
        )

    @property
    def webhook_service_ref(self) -> ServiceReference | None:
        """The Service the webhook configuration names; None means a URL client config."""
        return parse_service_reference(self.webhook_service) if self.webhook_service else None

    @property
    def watched_namespaces(self) -> frozenset[str]:
        """The namespaces to manage; empty means all."""
        return frozenset(p.strip() for p in self.namespaces.split(",") if p.strip())

    podset_qps: float = Field(default=0.0, ge=0, le=100000)
    """``TALLY_PODSET_QPS``: the PodSet controller's API requests a second (a token bucket in
    front of its pod writes and PodSet status writes, like kube-controller-manager's
    ``--kube-api-qps``, 20 upstream); 0 means unlimited."""
    podset_burst: int = Field(default=0, ge=0, le=100000)
    """``TALLY_PODSET_BURST``: requests the PodSet controller may make at once after a quiet
    spell (``--kube-api-burst``, 30 upstream); 0 means one second's worth of ``podset_qps``."""

    applied_quotas: bool = True
    """``TALLY_APPLIED_QUOTAS``: keep an AppliedClusterQuota in every namespace a ClusterQuota
    selects (what the people of that namespace may read of it); false: none, and those
    already written are left as they are."""
    applied_quota_interval: float = Field(default=1.0, ge=0, le=3600)
    """``TALLY_APPLIED_QUOTA_INTERVAL``: the least seconds between two writes of one
    AppliedClusterQuota; a burst of charges shows within it as one write of the latest total."""
    applied_quota_qps: float = Field(default=50.0, ge=0, le=100000)
    """``TALLY_APPLIED_QUOTA_QPS``: AppliedClusterQuota writes a second over all of them (a
    token bucket); 0 means unlimited."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        environ = os.environ if environ is None else environ
        fields = {
            name: environ[ENV_PREFIX + name.upper()]
            for name in cls.model_fields
            if ENV_PREFIX + name.upper() in environ
        }
        try:
            return cls.model_validate(fields)
        except ValidationError as error:
            problems = "; ".join(
                (
                    f"{ENV_PREFIX}{str(e['loc'][0]).upper()}={fields.get(str(e['loc'][0]))!r}: "
                    if e["loc"]
                    else ""  # a check across settings: its message names them
                )
                + e["msg"]
                for e in error.errors()
            )
            raise SettingsError(f"invalid settings: {problems}") from None
