"""ClusterQuota objects: reading the spec, the per-namespace view admission judges, the status.

A ClusterQuota (``clusterquotas.tally.dev``) is a ResourceQuotaSpec (``spec.quota``: ``hard``,
``scopes``, ``scopeSelector``) over the namespaces ``spec.namespaceSelector`` selects. Every
rule of a ResourceQuota applies unchanged, with the selected namespaces' usage added up; that is
why the rest of tally sees a ClusterQuota, in each namespace it selects, as a ResourceQuota-
shaped view (:func:`as_resource_quota`): the evaluators match objects against its scopes and
admission charges it with the same checks, its ``status.used`` being the *total*.

The status is OpenShift's ClusterResourceQuota shape, which users know: ``total`` (``hard`` and
``used``) and ``namespaces`` (``[{namespace, status: {used}}]``, sorted by namespace; unlike
OpenShift, a selected namespace that uses nothing is not listed), plus two fields for ``kubectl
get``'s columns (``namespaceCount``: every selected namespace; ``mostUsed``). ``total.used`` is
exactly the sum of the namespaces' ``used``. One condition in ``conditions`` (the
``metav1.Condition`` shape), :data:`USAGE_COMPUTED`, says whether every object's usage could be
computed: ``False`` while a measure fails on an object that exists (its message names the
object and the error; the usage controller then keeps that name's last value) or while the spec
cannot be used (reason ``InvalidSpec``), so a status that stopped moving says why.

Pure: plain JSON in and out; selector and quantity parsing from the core.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from tally.evaluators.base import quota_scopes
from tally.machinery.selectors import LabelSelector, SelectorError, parse_label_selector
from tally.quota import resources
from tally.quota.identity import CLUSTER_QUOTA_KIND
from tally.quota.quantity import ZERO, Quantity
from tally.quota.resources import ResourceList, ResourceListError, parse_resource_list

Obj = Mapping[str, Any]

USAGE_COMPUTED: Final = "UsageComputed"
"""The condition type: every object's usage of every hard name was computed at the last sync."""
REASON_COMPUTED: Final = "Computed"
REASON_EVALUATION_FAILED: Final = "EvaluationFailed"
REASON_PENDING: Final = "Pending"
REASON_INVALID_SPEC: Final = "InvalidSpec"
CONDITION_MESSAGE_ERRORS: Final = 3
"""Errors a condition's message quotes; the rest are counted."""
CONDITION_MESSAGE_MAX: Final = 1024


class InvalidClusterQuota(ValueError):
    """A ClusterQuota whose spec cannot be used; the message names the field."""


def name_of(cq: Obj) -> str:
    return str((cq.get("metadata") or {}).get("name") or "")


def spec_quota(cq: Obj) -> Obj:
    spec = cq.get("spec")
    quota = spec.get("quota") if isinstance(spec, Mapping) else None
    return quota if isinstance(quota, Mapping) else {}


def selector(cq: Obj) -> LabelSelector:
    """``spec.namespaceSelector`` parsed; raises :class:`InvalidClusterQuota`."""
    spec = cq.get("spec")
    raw = spec.get("namespaceSelector") if isinstance(spec, Mapping) else None
    if raw is None:
        raise InvalidClusterQuota("spec.namespaceSelector: Required value")
    try:
        return parse_label_selector(raw, "spec.namespaceSelector")
    except SelectorError as error:
        raise InvalidClusterQuota(str(error)) from None


def hard(cq: Obj) -> dict[str, Quantity]:
    """``spec.quota.hard`` parsed; raises :class:`InvalidClusterQuota`."""
    try:
        return parse_resource_list(spec_quota(cq).get("hard"), "spec.quota.hard")
    except ResourceListError as error:
        raise InvalidClusterQuota(str(error)) from None


def status_total(cq: Obj, field: str) -> dict[str, Quantity] | None:
    """``status.total.<field>`` parsed (None when missing); unparseable counts as missing."""
    status = cq.get("status")
    total = status.get("total") if isinstance(status, Mapping) else None
    raw = total.get(field) if isinstance(total, Mapping) else None
    if raw is None:
        return None
    try:
        return parse_resource_list(raw, f"status.total.{field}")
    except ResourceListError:
        return None


def namespace_used(cq: Obj) -> dict[str, dict[str, Quantity]]:
    """``status.namespaces`` as ``{namespace: used}`` (entries that do not parse are left out:
    the next sync rewrites them)."""
    result: dict[str, dict[str, Quantity]] = {}
    for namespace, raw in namespace_index(cq).items():
        try:
            result[namespace] = parse_resource_list(raw, "status.namespaces[].used")
        except ResourceListError:
            continue
    return result


def namespace_index(cq: Obj) -> dict[str, Any]:
    """``status.namespaces`` as ``{namespace: used}``, each ``used`` as written, unparsed: one
    namespace's share is then parsed alone (:func:`share_in`). Parsing every entry to read
    one is what made writing an AppliedClusterQuota into each of N namespaces cost N²."""
    status = cq.get("status")
    entries = status.get("namespaces") if isinstance(status, Mapping) else None
    index: dict[str, Any] = {}
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("namespace"), str):
            continue
        entry_status = entry.get("status")
        index[entry["namespace"]] = (
            entry_status.get("used") if isinstance(entry_status, Mapping) else None
        )
    return index


def share_in(index: Mapping[str, Any], namespace: str) -> dict[str, Quantity]:
    """``namespace``'s share from :func:`namespace_index`'s index; {} when it is not listed
    (it uses nothing) or does not parse (the next sync rewrites it)."""
    if namespace not in index:
        return {}
    try:
        return parse_resource_list(index[namespace], "status.namespaces[].used")
    except ResourceListError:
        return {}


def as_resource_quota(cq: Obj, namespace: str) -> dict[str, Any]:
    """The ResourceQuota-shaped view of ``cq`` in ``namespace``: its spec.quota as ``spec``,
    ``status.total`` as ``status`` (no status until the controller's first sync, so admission
    refuses what it would charge with "status unknown", as for a new ResourceQuota). The view
    carries the ClusterQuota's resourceVersion: a status write based on it is compare-and-swap
    on the ClusterQuota."""
    metadata = cq.get("metadata") or {}
    view: dict[str, Any] = {
        "kind": CLUSTER_QUOTA_KIND,
        "metadata": {
            "name": name_of(cq),
            "namespace": namespace,
            "resourceVersion": str(metadata.get("resourceVersion") or ""),
        },
        "spec": dict(spec_quota(cq)),
    }
    status = cq.get("status")
    total = status.get("total") if isinstance(status, Mapping) else None
    if isinstance(total, Mapping):
        view["status"] = {key: total[key] for key in ("hard", "used") if key in total}
    return view


def validate(cq: Obj) -> list[str]:
    """What is wrong with ``cq``'s spec, in ResourceQuota's words where they exist; [] if it is
    usable. Resource names no evaluator knows are checked by the caller (it has the registry)."""
    errors: list[str] = []
    try:
        selector(cq)
    except InvalidClusterQuota as error:
        errors.append(str(error))
    try:
        for name, value in hard(cq).items():
            if value.nanos < 0:
                errors.append(
                    f"spec.quota.hard[{name}]: Invalid value: {value}: must be greater than or "
                    "equal to 0"
                )
    except InvalidClusterQuota as error:
        errors.append(str(error))
    try:
        quota_scopes({"spec": spec_quota(cq)})
    except ValueError as error:
        errors.append(f"spec.quota.{error}".replace("spec.quota.spec.", "spec.quota."))
    return errors


def build_status(
    hard_list: ResourceList,
    used_by_namespace: Mapping[str, ResourceList],
    measured: Iterable[str],
    conditions: Iterable[Mapping[str, Any]] | None = None,
    written: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The status a sync writes: ``total.used`` is the sum of the namespaces' ``used``, with
    a zero for every ``measured`` name (the hard names some evaluator measures) that no
    namespace uses; ``conditions`` as given (none: no field). ``written``: namespaces whose
    share is listed as the status read had it, text and all (:func:`namespace_index`; their
    ``used_by_namespace`` entry is that text parsed): a sync that recalculated a few
    namespaces formats only theirs."""
    kept = written or {}
    total = resources.mask(_sum(used_by_namespace.values(), measured), hard_list)
    return {
        "total": {"hard": resources.to_strings(hard_list), "used": resources.to_strings(total)},
        # Namespaces that use nothing are left out (namespaceCount counts them): over a
        # thousand namespaces the list would be mostly zeros, and every status write, each of
        # admission's charges included, carries the whole list.
        "namespaces": [
            {
                "namespace": namespace,
                "status": {
                    "used": dict(kept[namespace])
                    if namespace in kept
                    else resources.to_strings(used)
                },
            }
            for namespace, used in sorted(used_by_namespace.items())
            if not resources.is_zero(used)
        ],
        "namespaceCount": len(used_by_namespace),
        "mostUsed": most_used(hard_list, total),
        **({"conditions": [dict(c) for c in conditions]} if conditions is not None else {}),
    }


def _sum(lists: Iterable[ResourceList], measured: Iterable[str]) -> dict[str, Quantity]:
    """``resources.add`` folded over ``lists`` from a zero for each ``measured`` name, in
    integers: a ClusterQuota's status sums thousands of shares at every sync. The format is
    upstream ``Add``'s: a name's first value, unless the sum so far is zero (then the addend's)."""
    nanos: dict[str, int] = dict.fromkeys(measured, 0)
    formats = dict.fromkeys(nanos, ZERO.format)
    for values in lists:
        for name, value in values.items():
            current = nanos.get(name)
            if current is None or current == 0:
                formats[name] = value.format
            nanos[name] = (current or 0) + value.nanos
    return {name: Quantity(value, formats[name]) for name, value in nanos.items()}


def condition(cq: Obj, type_: str) -> Obj | None:
    """The condition ``type_`` in ``cq``'s status, if any."""
    status = cq.get("status")
    found = status.get("conditions") if isinstance(status, Mapping) else None
    for entry in found if isinstance(found, list) else []:
        if isinstance(entry, Mapping) and entry.get("type") == type_:
            return entry
    return None


def usage_computed(
    cq: Obj, failures: Iterable[str], now: str, pending: Iterable[str] = ()
) -> dict[str, Any]:
    """The :data:`USAGE_COMPUTED` condition the next status of ``cq`` carries: ``False`` with
    ``failures`` (what could not be computed, each naming its object) quoted in the message,
    ``True`` without. ``pending``: hard names whose kind's cache is not listed yet (a kind
    just measured, or re-listed); they were not computed, so without failures the condition
    stays as it was (``Unknown`` for a first one). ``lastTransitionTime`` is ``now`` (RFC
    3339) only when the status changes, so a sync that finds what the last one found writes
    nothing new."""
    failures, pending = list(failures), sorted(pending)
    previous = condition(cq, USAGE_COMPUTED)
    if not failures and pending and previous is not None:
        return dict(previous)
    if not failures and pending:
        return _usage_condition(
            cq, "Unknown", REASON_PENDING, "waiting for the caches of: " + ", ".join(pending), now
        )
    if failures:
        quoted = "; ".join(failures[:CONDITION_MESSAGE_ERRORS])
        more = len(failures) - CONDITION_MESSAGE_ERRORS
        message = quoted + (f" (and {more} more)" if more > 0 else "")
        return _usage_condition(cq, "False", REASON_EVALUATION_FAILED, message, now)
    return _usage_condition(
        cq, "True", REASON_COMPUTED, "the usage of every object was computed", now
    )


def invalid_spec(cq: Obj, problem: str, now: str) -> dict[str, Any]:
    """The :data:`USAGE_COMPUTED` condition of a ClusterQuota whose spec cannot be used (one
    that got in while the webhook that refuses such specs was down): ``False``, the problem
    as the message."""
    return _usage_condition(cq, "False", REASON_INVALID_SPEC, problem, now)


def _usage_condition(cq: Obj, status: str, reason: str, message: str, now: str) -> dict[str, Any]:
    if len(message) > CONDITION_MESSAGE_MAX:
        message = message[: CONDITION_MESSAGE_MAX - 3] + "..."
    previous = condition(cq, USAGE_COMPUTED)
    since = previous.get("lastTransitionTime") if previous is not None else None
    if previous is None or previous.get("status") != status or not isinstance(since, str):
        since = now
    generation = (cq.get("metadata") or {}).get("generation")
    return {
        "type": USAGE_COMPUTED,
        "status": status,
        **({"observedGeneration": generation} if isinstance(generation, int) else {}),
        "lastTransitionTime": since,
        "reason": reason,
        "message": message,
    }


def charged_status(
    cq: Obj,
    charged_by_namespace: Mapping[str, ResourceList],
    total_used: ResourceList,
    given_back_by_namespace: Mapping[str, ResourceList] | None = None,
) -> dict[str, Any]:
    """``cq``'s status after admission charged it: ``total.used`` becomes ``total_used``
    (what admission computed on the view: the total read plus every charge of the pass), and
    each namespace's entry grows by what its requests were charged, so the total stays the sum
    of the namespaces. ``given_back_by_namespace``: charges ``cq``'s status holds for requests
    admission refused after writing them, which ``total_used`` no longer holds (the view was
    judged without them); each namespace's entry lowers by them. A namespace left using
    nothing is not listed, as in :func:`build_status`.

    Only the namespaces charged or given back are parsed and formatted again; every other
    entry is copied as written (one that does not parse, too: the next sync rewrites it). A
    charge is on the path of a create, and a ClusterQuota over ten thousand namespaces would
    otherwise parse and format all of them for each one."""
    status = dict(cq.get("status") or {})
    index = namespace_index(cq)
    changed: dict[str, dict[str, Quantity]] = {}
    for namespace, given in (given_back_by_namespace or {}).items():
        if namespace in index:
            share = share_in(index, namespace)
            changed[namespace] = resources.subtract_non_negative(
                share, resources.mask(given, share)
            )
    for namespace, charged in charged_by_namespace.items():
        share = changed[namespace] if namespace in changed else share_in(index, namespace)
        changed[namespace] = resources.add(share, charged)
    entries: dict[str, Mapping[str, str]] = {
        namespace: dict(written)
        for namespace, written in index.items()
        if namespace not in changed and isinstance(written, Mapping) and written
    }  # fmt: skip
    entries.update(
        (namespace, resources.to_strings(used))
        for namespace, used in changed.items()
        if not resources.is_zero(used)
    )
    total = dict(status.get("total") or {})
    total["used"] = resources.to_strings(total_used)
    status["total"] = total
    status["namespaces"] = [
        {"namespace": name, "status": {"used": used}} for name, used in sorted(entries.items())
    ]
    # namespaceCount stays: it counts selected namespaces, listed or not (build_status).
    hard_list = status_total(cq, "hard") or {}
    status["mostUsed"] = most_used(hard_list, total_used)
    return status


def most_used(hard_list: ResourceList, used: ResourceList) -> str:
    """``<name> <used>/<hard>`` of the resource closest to its limit (by fraction; a zero
    limit in use counts as full); "" when nothing is limited."""
    best: tuple[float, str] | None = None
    for name, limit in sorted(hard_list.items()):
        value = used.get(name, ZERO)
        # A zero limit in use is as full as can be.
        full = 1.0 if value.nanos > 0 else 0.0
        fraction = value.nanos / limit.nanos if limit.nanos > 0 else full
        if best is None or fraction > best[0]:
            best = (fraction, f"{name} {value}/{limit}")
    return "" if best is None else best[1]


def selected_namespaces(
    cq_selector: LabelSelector, namespaces: Iterable[tuple[str, Obj]]
) -> list[str]:
    """The names of the namespaces (name, labels) the selector selects, sorted."""
    return sorted(name for name, labels in namespaces if cq_selector.matches(labels))


def raised_shares(old: Obj, new: Obj) -> dict[str, dict[str, Quantity]]:
    """What a status update raised in each namespace's share, per name the old total carried
    (a namespace not listed before used nothing of them). That is what a charge by admission
    looks like on the watch, whichever replica made it; a name new in the total is the
    controller's first calculation, not a charge.

    Shares are compared as written and only those whose text changed are parsed: every status
    event passes here, and a charge changes one namespace's share of thousands."""
    before_total = status_total(old, "used")
    if before_total is None:
        return {}
    before, after = namespace_index(old), namespace_index(new)
    raised: dict[str, dict[str, Quantity]] = {}
    for namespace, written in after.items():
        if namespace in before and before[namespace] == written:
            continue
        used, previous = share_in(after, namespace), share_in(before, namespace)
        grown = {
            name: value - previous.get(name, Quantity(0))
            for name, value in used.items()
            if name in before_total and value > previous.get(name, Quantity(0))
        }
        if grown:
            raised[namespace] = grown
    return raised
