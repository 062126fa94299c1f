"""Operator settings, read once at start-up from ``TALLY_*`` environment variables.

A pydantic model because this is a boundary: values arrive as strings from a Deployment or a
shell, and a typo or an absurd value must stop the operator with a message naming the variable,
not surface later as odd behaviour. Kopf's own settings (watching, peering) stay in the Kopf
wiring; these are tally's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tally.webhook import ServiceReference, parse_service_reference

ENV_PREFIX: Final = "TALLY_"
_DNS1123_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


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
    workers: int = Field(default=5, ge=1, le=100)
    """``TALLY_WORKERS``: workers per quota controller queue (upstream
    ``--concurrent-resource-quota-syncs``)."""
    metrics_addr: str = "0.0.0.0"
    """``TALLY_METRICS_ADDR``: where ``/metrics`` listens."""
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    """``TALLY_METRICS_PORT``: ``/metrics`` port; 0 turns the endpoint off."""

    webhook_enabled: bool = True
    """``TALLY_WEBHOOK_ENABLED``: serve and register the quota admission webhook."""
    webhook_addr: str = "127.0.0.1"
    """``TALLY_WEBHOOK_ADDR``: where the webhook server listens."""
    webhook_port: int = Field(default=9443, ge=1, le=65535)
    """``TALLY_WEBHOOK_PORT``: the webhook server's port."""
    webhook_host: str = ""
    """``TALLY_WEBHOOK_HOST``: the host the API server dials (URL and certificate SAN);
    default: the listening address."""
    webhook_service: str = ""
    """``TALLY_WEBHOOK_SERVICE``: ``<namespace>/<name>[:<port>]`` of the Service in front of the
    webhook server (port 443 by default). Set in a cluster: the webhook configuration then names
    the Service instead of a URL, and the serving certificate's SANs include
    ``<name>.<namespace>.svc`` (and ``.svc.cluster.local``)."""
    webhook_cert_dir: str = ""
    """``TALLY_WEBHOOK_CERT_DIR``: where the generated CA and serving pair are written;
    default: a private temporary directory."""
    webhook_failure_policy: Literal["Fail", "Ignore"] = "Fail"
    """``TALLY_WEBHOOK_FAILURE_POLICY``: what the API server does when tally cannot answer."""
    webhook_config_name: str = Field(default="tally.dev", min_length=1)
    """``TALLY_WEBHOOK_CONFIG_NAME``: the ValidatingWebhookConfiguration tally manages."""
    webhook_remove_on_exit: bool = True
    """``TALLY_WEBHOOK_REMOVE_ON_EXIT``: delete the configuration on a graceful exit. Right for
    local development (a dead fail-closed webhook blocks every pod create); set false in a
    cluster, where refusing creates while tally is down is what keeps quotas limits."""
    namespace: str = ""
    """``TALLY_NAMESPACE``: the operator's own namespace, exempt from the webhook like
    kube-system (so tally's own pods can always be created). The start-up probe for the
    built-in quota system runs there (in kube-system when unset)."""
    allow_builtin_quota: bool = False
    """``TALLY_ALLOW_BUILTIN_QUOTA``: start even when the start-up probe sees upstream's own
    quota admission plugin or controller on (logged as a warning). Off: tally refuses to start
    then (see :mod:`tally.builtin_quota`)."""
    admission_workers: int = Field(default=5, ge=1, le=100)
    """``TALLY_ADMISSION_WORKERS``: namespaces evaluated at once (upstream: 5)."""
    admission_config: str = ""
    """``TALLY_ADMISSION_CONFIG``: path of a ``ResourceQuotaConfiguration`` (LimitedResources)."""

    @field_validator("namespaces", "namespace")
    @classmethod
    def _valid_namespaces(cls, value: str) -> str:
        for name in (part.strip() for part in value.split(",")):
            if name and not _DNS1123_LABEL.fullmatch(name):
                raise ValueError(f"{name!r} is not a valid namespace name")
        return value

    @field_validator("webhook_service")
    @classmethod
    def _valid_webhook_service(cls, value: str) -> str:
        if value:
            parse_service_reference(value)
        return value

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

    test_podset_pod_event_delay: float = Field(default=0.0, ge=0, le=60)
    """``TALLY_TEST_PODSET_POD_EVENT_DELAY``: test only. Seconds by which every pod event
    reaches the PodSet controller late (its cache lags the API), so that an e2e test can show
    that its expectations, not a fresh cache, keep it from creating too many pods. 0: off."""

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
                f"{ENV_PREFIX}{str(e['loc'][0]).upper()}={fields.get(str(e['loc'][0]))!r}: "
                f"{e['msg']}"
                for e in error.errors()
            )
            raise SettingsError(f"invalid settings: {problems}") from None
