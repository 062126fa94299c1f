"""Is the cluster's own quota system on? What the start-up probe saw, and what tally does about it.

tally re-implements upstream's ResourceQuota admission plugin (kube-apiserver) and
resourcequota controller (kube-controller-manager). If either still runs, every create is
charged twice (once by each admission) and two controllers write ``status.used`` with
different ideas of reservations, so quotas fill up early and flap. tally therefore checks at
start-up, with a probe quota (:mod:`tally.builtin_quota.probe` does the I/O). Where the built-in
system is on (every managed cluster) tally enforces ClusterQuotas only: it writes nothing onto
ResourceQuotas and its webhook judges only what ClusterQuotas charge, while upstream keeps
enforcing ResourceQuotas. ``TALLY_ALLOW_BUILTIN_QUOTA`` makes it enforce both anyway.

What the probe can observe, and how it is read here:

* **Controller**: someone other than tally writes the probe quota's status. The writer is read
  from ``metadata.managedFields`` (entries with ``subresource: status``), not from the status
  itself, so a second tally that fills the probe's status (manager ``tally``) is not taken for
  upstream's controller (manager ``kube-controller-manager``).
* **Admission plugin**: with the probe's ``status.hard`` set to ``resourcequotas: 0``, a
  server-side dry-run create of another ResourceQuota in the same namespace is refused with
  upstream's own words, ``exceeded quota: …`` (or ``status unknown for quota: …``). A webhook
  answers in the API server's webhook wording (``admission webhook "…" denied the request``,
  ``failed calling webhook "…"``) and runs *before* the built-in plugin (ResourceQuota is the
  last validating plugin: ``AllOrderedPlugins`` in kubernetes ``pkg/kubeapiserver/options/
  plugins.go``), so such an answer says nothing about the plugin: unknown.

Fail-safe stance: only what was *seen* to be on leaves ResourceQuotas to the built-in system.
A probe that cannot tell (no permission, API errors, a failing webhook, the time bound) starts
tally enforcing both, with a warning that says what to check: the check guards against a
configuration mistake, not an attacker.

Pure: no I/O, no kopf, kubernetes-asyncio or pydantic; unit-tested with plain data.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

PROBE_NAME: Final = "tally-builtin-quota-probe"
"""The probe quota's fixed name: a crashed start's leftover is found (and deleted) by name, and
the Role in ``manifests/`` can grant get/update/delete on this one object only."""
DRY_RUN_NAME: Final = f"{PROBE_NAME}-dry-run"
"""The ResourceQuota the dry-run create names (never stored)."""
PROBE_RESOURCE: Final = "resourcequotas"
"""What the probe limits (to 0): ResourceQuotas in the probe namespace. Upstream counts them
(legacy object count), the dry-run object is then another ResourceQuota (no permission beyond
the probe's own), and while the probe exists only quota creates in that one namespace can be
refused — nobody else creates quotas in tally's namespace or kube-system."""
PROBE_LABELS: Final = {
    "app.kubernetes.io/name": "tally",
    "app.kubernetes.io/component": "builtin-quota-probe",
}
ALLOW_SETTING: Final = "TALLY_ALLOW_BUILTIN_QUOTA"

APISERVER_FLAG: Final = "kube-apiserver --disable-admission-plugins=ResourceQuota"
APISERVER_FLAG_NOTE: Final = "(and ResourceQuota not named in --enable-admission-plugins)"
CONTROLLER_MANAGER_FLAG: Final = "kube-controller-manager --controllers=*,-resourcequota-controller"
CONTROLLER_MANAGER_FLAG_NOTE: Final = (
    "(-resourcequota, the legacy alias, works too; in an explicit list, the first entry naming "
    "the controller wins)"
)

# Upstream's ResourceQuota admission plugin (apiserver/pkg/admission/plugin/resourcequota/
# controller.go): the refusals a request can get from a quota that limits what it creates.
_PLUGIN_REFUSALS: Final = ("exceeded quota: ", "status unknown for quota: ")
# The API server's wording for a validating webhook's answer (apiserver/pkg/admission/plugin/
# webhook/errors, .../validating/dispatcher.go).
_WEBHOOK_DENIED: Final = re.compile(r'admission webhook "([^"]*)" denied the request')
_WEBHOOK_FAILED: Final = re.compile(r'failed calling webhook "([^"]*)"')


class State(enum.Enum):
    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Finding:
    """What the probe concluded about one part of the built-in quota system."""

    state: State
    detail: str
    """What was seen, in words for the log (quoted API messages, who wrote what, how fast)."""


@dataclass(frozen=True)
class ProbeResult:
    namespace: str
    """Where the probe quota was created."""
    admission: Finding
    """kube-apiserver's ResourceQuota admission plugin."""
    controller: Finding
    """kube-controller-manager's resourcequota-controller."""
    elapsed: float
    """Seconds the probe took (for the log: start-up cost)."""


class Action(enum.Enum):
    PROCEED = "proceed"
    WARN = "warn"
    """Start, but log the message as a warning."""
    CLUSTER_QUOTAS_ONLY = "cluster-quotas-only"
    """Enforce ClusterQuotas only: ResourceQuotas are the built-in system's (tally writes nothing
    onto them and does not judge them)."""


@dataclass(frozen=True)
class Decision:
    action: Action
    message: str


def probe_namespace(operator_namespace: str) -> str:
    """Where the probe runs: tally's own namespace (``TALLY_NAMESPACE``), else kube-system.
    tally's webhook exempts both, so no tally webhook — an earlier run's, dead or alive —
    stands between the probe and the built-in plugin, and a tally webhook enforcing the probe
    quota elsewhere cannot refuse anyone's quota creates meanwhile."""
    return operator_namespace or "kube-system"


# -- reading what the probe saw


def status_writers(quota: Mapping[str, Any]) -> frozenset[str]:
    """The field managers that wrote the quota's status subresource (``managedFields``)."""
    entries = (quota.get("metadata") or {}).get("managedFields") or []
    return frozenset(
        str(entry.get("manager") or "")
        for entry in entries
        if isinstance(entry, Mapping) and entry.get("subresource") == "status"
    )


def has_status_hard(quota: Mapping[str, Any]) -> bool:
    """Whether upstream's admission plugin would enforce the quota: it reads ``status.hard``
    only (a quota whose status was never written is not enforced)."""
    return bool(((quota.get("status") or {}).get("hard") or {}).get(PROBE_RESOURCE) is not None)


def foreign_status_writers(quota: Mapping[str, Any], own_manager: str) -> frozenset[str]:
    """Writers of the status other than tally (``own_manager``: every tally, this one or
    another, writes status under the same field manager)."""
    return status_writers(quota) - {own_manager}


def controller_finding(
    writers: Iterable[str], waited: float, *, observed: bool, error: str = ""
) -> Finding:
    """The controller's state once the probe stopped watching the probe quota's status.

    ``writers``: foreign status writers seen (:func:`foreign_status_writers`); ``waited``:
    seconds since the probe quota was created; ``observed``: whether the quota could be read
    at all; ``error``: the last read error, if any.
    """
    names = sorted(set(writers))
    if names:
        return Finding(
            State.ON,
            f"{', '.join(names)} wrote the probe quota's status within {waited * 1000:.0f} ms",
        )
    if not observed:
        return Finding(State.UNKNOWN, f"the probe quota could not be read: {error or 'no answer'}")
    return Finding(State.OFF, f"nobody but tally wrote the probe quota's status in {waited:.1f} s")


def admission_finding(status: int, message: str, *, what: str) -> Finding:
    """Read the API server's answer to a create in the probe namespace.

    ``status``: the HTTP status (2xx: admitted); ``message``: the Status message of a refusal;
    ``what``: the request, for the detail (``"a dry-run create of a ResourceQuota"``).
    Admitted is *off* only if the probe's ``status.hard`` had settled (the caller's business).
    """
    if 200 <= status < 300:
        return Finding(State.OFF, f"{what} was admitted while the probe quota limits it to 0")
    failed = _WEBHOOK_FAILED.search(message)
    if failed:
        return Finding(
            State.UNKNOWN,
            f"{what} failed at webhook {failed.group(1)!r} ({_quote(message)}); webhooks run "
            "before the built-in plugin, so its state cannot be told",
        )
    denied = _WEBHOOK_DENIED.search(message)
    if denied:
        return Finding(
            State.UNKNOWN,
            f"{what} was refused by webhook {denied.group(1)!r} ({_quote(message)}); webhooks "
            "run before the built-in plugin, so its state cannot be told",
        )
    for refusal in _PLUGIN_REFUSALS:
        at = message.find(refusal)
        if status == 403 and at >= 0:
            return Finding(State.ON, f"{what} was refused: {_quote(message[at:])}")
    return Finding(State.UNKNOWN, f"{what} failed: HTTP {status} {_quote(message)}")


def _quote(message: str, limit: int = 300) -> str:
    message = " ".join(message.split())
    return f'"{message[:limit]}…"' if len(message) > limit else f'"{message}"'


# -- what to do


def decide(result: ProbeResult, *, allowed: bool) -> Decision:
    """ClusterQuotas only when a part was seen on (unless ``allowed``: then both, with a
    warning), warn when the probe could not tell, proceed otherwise. The message names the
    exact flags for every part not seen off."""
    parts = (
        ("kube-apiserver's ResourceQuota admission plugin", result.admission, APISERVER_FLAG,
         APISERVER_FLAG_NOTE),
        ("kube-controller-manager's resourcequota-controller", result.controller,
         CONTROLLER_MANAGER_FLAG, CONTROLLER_MANAGER_FLAG_NOTE),
    )  # fmt: skip
    seen = " ".join(f"{name}: {f.state.value} ({f.detail})." for name, f, _, _ in parts)
    fixes = " and ".join(f"{flag} {note}" for _, f, flag, note in parts if f.state is not State.OFF)
    probe = f"(Probe: quota {result.namespace}/{PROBE_NAME}, {result.elapsed * 1000:.0f} ms.)"
    on = any(f.state is State.ON for _, f, _, _ in parts)
    unknown = any(f.state is State.UNKNOWN for _, f, _, _ in parts)
    if on and not allowed:
        return Decision(
            Action.CLUSTER_QUOTAS_ONLY,
            "the cluster's built-in quota system is on: tally enforces ClusterQuotas only and "
            f"leaves ResourceQuotas to it. {seen} For tally to enforce ResourceQuotas too, turn "
            f"it off: {fixes}. {probe}",
        )
    if on:
        return Decision(
            Action.WARN,
            f"the cluster's built-in quota system is on, and tally enforces quotas beside it "
            f"because {ALLOW_SETTING}=true: every create is charged twice and two controllers "
            f"write status.used. {seen} Turn it off: {fixes}. {probe}",
        )
    if unknown:
        return Decision(
            Action.WARN,
            "could not tell whether the cluster's built-in quota system is off; starting "
            f"anyway. {seen} It must be off: {fixes}. To check by hand: with tally stopped, a "
            "new ResourceQuota gets no status when the controller is off. "
            f"{probe}",
        )
    return Decision(Action.PROCEED, f"the cluster's built-in quota system is off. {seen} {probe}")
