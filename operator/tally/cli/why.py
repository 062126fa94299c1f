"""``kubectl tally why``: what an object would be charged, by which quotas, and the server's word.

Two halves. The explanation (:func:`explain`) runs upstream's quota check for a create
(``CheckRequest``, which :mod:`tally.admission.checks` ports) step by step with tally's
evaluators, keeping every step's outcome for the reader instead of stopping at the first
refusal: the object's usage (the evaluator's ``usage``, zeros dropped), then per quota binding
the namespace whether it tracks a name the evaluator measures, which of its scopes the object
falls under (``matches_scope``), the evaluator's constraints (``must specify requests.cpu``),
whether the controller has written the use, and used + requested against hard. ClusterQuotas
come in as the ResourceQuota-shaped views admission judges (``status`` is the total).

The decision is not this module's: the caller asks the API server for a dry-run create, and
:func:`parse_denial` reads a refusal in upstream's words (``exceeded quota: demo, requested:
pods=1, used: pods=5, limited: pods=5``; ``exceeded cluster quota: …``; ``failed quota: …``)
to say which quota refused and by how much, from the server's own figures. The explanation can
disagree with the server (a status that moved between the read and the dry run, another
admission plugin, tally not enforcing ResourceQuotas where the built-in quota system is on);
the server is right, and the output says so.

Left out: the admission configuration's limitedResources (not readable by a client), updates.
Pure: API JSON in, dataclasses out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import yaml

from tally.cli.status import RESOURCE_QUOTA, describe_scope
from tally.evaluators.base import ConstraintError, Evaluator, quota_scopes
from tally.quota import resources
from tally.quota.identity import CLUSTER_QUOTA_KIND
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceListError, parse_resource_list

__all__ = [
    "Charge",
    "Decision",
    "Denial",
    "Explanation",
    "ManifestError",
    "QuotaRef",
    "QuotaVerdict",
    "explain",
    "load_manifest",
    "parse_denial",
]

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class QuotaRef:
    """A quota binding the namespace: a ResourceQuota as read, or a ClusterQuota's view
    (:func:`tally.clusterquota.quota.as_resource_quota`)."""

    kind: str
    name: str
    view: Obj


@dataclass(frozen=True)
class Charge:
    """One resource a quota would be charged."""

    name: str
    requested: Quantity
    used: Quantity | None
    hard: Quantity

    @property
    def after(self) -> Quantity | None:
        return None if self.used is None else self.used + self.requested

    @property
    def over_by(self) -> Quantity | None:
        """How far past ``hard`` the charge would take the quota; None when it fits."""
        after = self.after
        if after is None or after.nanos <= self.hard.nanos:
            return None
        return after - self.hard


@dataclass(frozen=True)
class QuotaVerdict:
    kind: str
    name: str
    tracked: tuple[str, ...]
    """The quota's hard names the object's evaluator measures."""
    scopes: tuple[tuple[str, bool], ...] = ()
    """Each scope of the quota, and whether the object falls under it."""
    applies: bool = False
    """It tracks what the evaluator measures and every scope matches: it is charged."""
    not_applying: str = ""
    """Why it is not charged, when it is not."""
    failed: str = ""
    """A constraint the object breaks (upstream's words), which refuses it."""
    unknown: tuple[str, ...] = ()
    """Tracked names the controller has not written a use for (admission refuses then)."""
    charges: tuple[Charge, ...] = ()
    problem: str = ""
    """The quota could not be read (a value that does not parse)."""

    @property
    def fits(self) -> bool:
        if not self.applies:
            return True
        return (
            not self.failed
            and not self.unknown
            and not self.problem
            and all(c.over_by is None for c in self.charges)
        )


@dataclass(frozen=True)
class Explanation:
    kind: str
    name: str
    namespace: str
    usage: Mapping[str, Quantity]
    """What the evaluator says the object uses (zeros dropped: they charge nothing)."""
    quotas: tuple[QuotaVerdict, ...] = ()
    untracked: str = ""
    """Why no quota can charge the object at all (an ignored kind), or ""."""
    problem: str = ""
    """Why the object could not be measured, or ""."""

    @property
    def fits(self) -> bool:
        return not self.problem and all(q.fits for q in self.quotas)


def _status_list(view: Obj, key: str) -> dict[str, Quantity] | None:
    status = view.get("status")
    if not isinstance(status, Mapping) or status.get(key) is None:
        return None
    return parse_resource_list(status.get(key), f"status.{key}")


def _verdict(
    ref: QuotaRef, evaluator: Evaluator, obj: Obj, usage: Mapping[str, Quantity]
) -> QuotaVerdict | None:
    """Upstream's steps for one quota; None when it tracks nothing the evaluator measures."""
    try:
        hard = _status_list(ref.view, "hard")
        used = _status_list(ref.view, "used")
        if hard is None:
            spec = ref.view.get("spec")
            spec_hard = spec.get("hard") if isinstance(spec, Mapping) else None
            tracked = evaluator.matching_resources(parse_resource_list(spec_hard, "spec.hard"))
            if not tracked:
                return None
            return QuotaVerdict(
                ref.kind,
                ref.name,
                tuple(sorted(tracked)),
                not_applying="its status is not written yet (quota admission skips it until then)",
            )
        tracked = sorted(evaluator.matching_resources(hard))
        if not tracked:
            return None
        scopes = tuple(
            (describe_scope(scope), evaluator.matches_scope(scope, obj))
            for scope in quota_scopes(ref.view)
        )
    except (ResourceListError, ValueError) as error:
        return QuotaVerdict(ref.kind, ref.name, (), applies=True, problem=str(error))
    unmatched = [name for name, matched in scopes if not matched]
    if unmatched:
        return QuotaVerdict(
            ref.kind,
            ref.name,
            tuple(tracked),
            scopes,
            not_applying="the object is not in its scope " + ", ".join(unmatched),
        )
    failed = ""
    try:
        evaluator.constraints(tracked, obj)
    except ConstraintError as error:
        failed = str(error)
    used = used or {}
    unknown = tuple(name for name in tracked if name in hard and name not in used)
    requested = resources.mask(usage, hard)
    charges = tuple(
        Charge(name, requested[name], used.get(name), hard[name]) for name in sorted(requested)
    )
    return QuotaVerdict(
        ref.kind,
        ref.name,
        tuple(tracked),
        scopes,
        applies=True,
        failed=failed,
        unknown=unknown,
        charges=charges,
    )


def explain(
    obj: Obj,
    kind: str,
    namespace: str,
    evaluator: Evaluator | None,
    quotas: Sequence[QuotaRef],
) -> Explanation:
    """What creating ``obj`` (a ``kind`` in ``namespace``) would charge each of ``quotas``;
    ``evaluator`` None means the kind is never quota-tracked."""
    metadata = obj.get("metadata")
    name = ""
    if isinstance(metadata, Mapping):
        name = str(metadata.get("name") or metadata.get("generateName") or "")
    if evaluator is None:
        return Explanation(kind, name, namespace, {}, untracked=f"{kind} is never quota-tracked")
    try:
        usage = resources.remove_zeros(evaluator.usage(obj))
    except ValueError as error:
        return Explanation(kind, name, namespace, {}, problem=f"cannot measure it: {error}")
    verdicts = [_verdict(ref, evaluator, obj, usage) for ref in quotas]
    return Explanation(kind, name, namespace, usage, tuple(v for v in verdicts if v is not None))


# -- the server's refusal --

_EXCEEDED: Final = re.compile(
    r"exceeded (?P<cluster>cluster )?quota: (?P<name>[^,\s]+), requested: (?P<requested>\S*), "
    r"used: (?P<used>\S*), limited: (?P<limited>\S*)"
)
_FAILED: Final = re.compile(r"failed (?P<cluster>cluster )?quota: (?P<name>[^:\s]+): (?P<why>.*)")
_UNKNOWN: Final = re.compile(r"status unknown for (?P<cluster>cluster )?quota: (?P<name>[^,\s]+)")


def _pairs(text: str) -> dict[str, Quantity]:
    """``pods=1,requests.cpu=500m`` (upstream's ``prettyPrint``) as a resource list."""
    raw: dict[str, str] = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        raw[name] = value
    return parse_resource_list(raw, "message")


@dataclass(frozen=True)
class Denial:
    """A refusal, and what it says when it is a quota's."""

    message: str
    reason: str = ""
    """``exceeded``, ``failed`` (a constraint), ``status unknown``, or "" (not a quota's)."""
    kind: str = ""
    """:data:`RESOURCE_QUOTA` or :data:`CLUSTER_QUOTA_KIND` when a quota refused."""
    quota: str = ""
    requested: Mapping[str, Quantity] = field(default_factory=dict)
    used: Mapping[str, Quantity] = field(default_factory=dict)
    limited: Mapping[str, Quantity] = field(default_factory=dict)

    @property
    def over_by(self) -> dict[str, Quantity]:
        """Per exceeded name, ``used + requested - limited`` (the server's figures)."""
        result: dict[str, Quantity] = {}
        for name, limit in self.limited.items():
            after = self.used.get(name, Quantity(0)) + self.requested.get(name, Quantity(0))
            if after.nanos > limit.nanos:
                result[name] = after - limit
        return result


def parse_denial(message: str) -> Denial:
    """Read a refusal's message (the API server's, webhook prefix and all)."""
    if found := _EXCEEDED.search(message):
        kind = CLUSTER_QUOTA_KIND if found.group("cluster") else RESOURCE_QUOTA
        try:
            return Denial(
                message,
                "exceeded",
                kind,
                found.group("name"),
                _pairs(found.group("requested")),
                _pairs(found.group("used")),
                _pairs(found.group("limited")),
            )
        except ResourceListError:
            return Denial(message, "exceeded", kind, found.group("name"))
    if found := _FAILED.search(message):
        kind = CLUSTER_QUOTA_KIND if found.group("cluster") else RESOURCE_QUOTA
        return Denial(message, "failed", kind, found.group("name"))
    if found := _UNKNOWN.search(message):
        kind = CLUSTER_QUOTA_KIND if found.group("cluster") else RESOURCE_QUOTA
        return Denial(message, "status unknown", kind, found.group("name"))
    return Denial(message)


@dataclass(frozen=True)
class Decision:
    """The API server's answer to the dry-run create."""

    allowed: bool
    denial: Denial | None = None
    """What the refusal says, when refused."""


class ManifestError(ValueError):
    """The file given to ``why`` is not one object."""


def load_manifest(text: str, source: str) -> dict[str, Any]:
    """The one object in ``text`` (YAML or JSON, as ``kubectl create -f`` reads it)."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise ManifestError(f"{source}: not YAML or JSON: {' '.join(str(error).split())}") from None
    if len(documents) != 1:
        raise ManifestError(f"{source}: expected one object, found {len(documents)}")
    obj = documents[0]
    if not isinstance(obj, dict):
        raise ManifestError(f"{source}: expected an object, found {type(obj).__name__}")
    for key in ("apiVersion", "kind"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            raise ManifestError(f"{source}: the object has no {key}")
    if obj["kind"].endswith("List"):
        raise ManifestError(f"{source}: a {obj['kind']}: give one object")
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or not (metadata.get("name") or metadata.get("generateName")):
        raise ManifestError(f"{source}: the object has no metadata.name (or generateName)")
    return obj
