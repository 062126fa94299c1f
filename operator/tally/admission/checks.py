"""The quota decision for one request, and for a batch of requests against running totals.

This module owns upstream ``checkRequest`` (``CheckRequest`` in
``apiserver/pkg/admission/plugin/resourcequota/controller.go``) as :func:`check_request`, and
phase 1 of ``checkQuotas`` (check every waiter against the running quotas) as
:func:`check_batch`. Both are pure: they read API JSON quotas and objects, never mutate them,
and return new quota objects whose ``status.used`` carries the charge. The I/O half of
``checkQuotas`` (compare-and-swap writes and retries) is in ``evaluator.py``.

:func:`check_request` runs upstream's steps in upstream's order, because the order decides
which message a request gets when several rules fail:

1. the evaluator does not handle the request → unchanged, allowed;
2. LimitedResources: scopes of the object that need a covering quota, and names of its usage
   (for this group/resource) that need one;
3. for each quota in list order: collect the scopes of the object it selects; skip it unless it
   matches (a tracked name in ``status.hard`` and every scope); constraints → ``failed
   quota``; a matched hard name without ``status.used`` → ``status unknown``;
4. the object's usage; negative values → ``quota usage is negative``;
5. UPDATE: no old object → ``unable to get previous usage``; an old object without
   resourceVersion is a create-on-update and is charged in full; otherwise the charge is
   ``max(new - old, 0)`` for quotas that matched the old object too, and the full new usage for
   quotas that match only the new one (a scope change);
6. zero entries are dropped; nothing left → unchanged, allowed;
7. uncovered limited names → ``insufficient quota to consume``; uncovered limited scopes →
   ``insufficient quota to match these scopes`` (a 500 upstream: a plain error);
8. for each matching quota: the charge masked to its hard names is added to ``used``; only the
   charged names are compared with ``hard``; the first quota over its limit wins with
   ``exceeded quota: …``.

Where tally differs from upstream, on purpose:

* An evaluator error while matching the object against the LimitedResources scopes denies
  (500); upstream admits the request uncharged. A request that could not be measured must not
  pass unmeasured.
* Errors reading a quota (a ``status`` value that does not parse) deny with a 500 naming the
  quota and field; upstream's typed objects cannot carry such values.

Left out: batching, writes and retries (``evaluator.py``), filtering by operation or namespace
(also ``evaluator.py``), and the API server's ``<resource> "<name>" is forbidden: `` prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from tally.admission.attributes import Attributes, resource_version
from tally.admission.config import LimitedResource
from tally.admission.errors import AdmissionDenied, forbidden, unknown_error
from tally.evaluators.base import (
    ConstraintError,
    Evaluator,
    GroupResource,
    Operation,
    ScopeRequirement,
    quota_scopes,
)
from tally.evaluators.measured import MeasuredEvaluator
from tally.measures import MeasureEvaluationError
from tally.quota import resources as quota
from tally.quota.identity import is_cluster_quota, quota_name
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList

__all__ = [
    "PRIOR_VERSION_NOT_FOUND",
    "BatchResult",
    "Quota",
    "Request",
    "check_batch",
    "check_request",
    "check_request_charges",
    "exceeded_quota_message",
    "failed_quota_message",
    "has_usage_stats",
    "insufficient_quota_message",
    "insufficient_scopes_message",
    "limited_by_default",
    "pretty_print",
    "pretty_print_resource_names",
    "quota_kind",
    "scope_matching_error_message",
    "status_unknown_message",
]

logger = logging.getLogger(__name__)

Quota = Mapping[str, Any]
"""A ResourceQuota as API JSON. Never mutated: charges produce new objects."""

PRIOR_VERSION_NOT_FOUND: Final = (
    "unable to get previous usage since prior version of object was not found"
)


# -- messages (upstream's fmt.Errorf texts) --


def pretty_print(resources: ResourceList) -> str:
    """Upstream ``prettyPrint``: ``name=quantity`` sorted by name, joined by ``,``."""
    return quota.pretty_print(resources)


def pretty_print_resource_names(names: Iterable[str]) -> str:
    """Upstream ``prettyPrintResourceNames``: sorted, joined by ``,``."""
    return ",".join(sorted(names))


def failed_quota_message(quota_name: str, error: object, kind: str = "quota") -> str:
    return f"failed {kind}: {quota_name}: {error}"


def status_unknown_message(quota_name: str, names: Iterable[str], kind: str = "quota") -> str:
    return f"status unknown for {kind}: {quota_name}, resources: " + pretty_print_resource_names(
        names
    )


def insufficient_quota_message(names: Iterable[str]) -> str:
    return f"insufficient quota to consume: {','.join(sorted(names))}"


def insufficient_scopes_message(scopes: Sequence[ScopeRequirement]) -> str:
    # Go's %v of a []ScopedResourceSelectorRequirement: [{BestEffort Exists []} {...}]
    return f"insufficient quota to match these scopes: [{' '.join(str(s) for s in scopes)}]"


def exceeded_quota_message(
    quota_name: str,
    requested: ResourceList,
    used: ResourceList,
    hard: ResourceList,
    kind: str = "quota",
) -> str:
    """Upstream's ``exceeded quota: …``; ``kind`` is ``cluster quota`` for a ClusterQuota (its
    ``used`` is the total over the namespaces it selects)."""
    return (
        f"exceeded {kind}: {quota_name}, requested: {pretty_print(requested)}, "
        f"used: {pretty_print(used)}, limited: {pretty_print(hard)}"
    )


def quota_kind(q: Quota) -> str:
    """How messages name ``q``: ``quota``, or ``cluster quota`` for a ClusterQuota's view."""
    return "cluster quota" if is_cluster_quota(q) else "quota"


def scope_matching_error_message(quota_name: str, error: object) -> str:
    return f"error matching scopes of quota {quota_name}, err: {error}"


# -- helpers --


def limited_by_default(
    usage: ResourceList, limited_resources: Iterable[LimitedResource]
) -> set[str]:
    """Upstream ``limitedByDefault``: consumed names (value > 0) containing a ``matchContains``."""
    result: set[str] = set()
    for limited in limited_resources:
        for name, value in usage.items():
            if value.nanos > 0 and any(part in name for part in limited.match_contains):
                result.add(name)
    return result


def has_usage_stats(hard: ResourceList, used: ResourceList, interesting: Iterable[str]) -> bool:
    """Upstream ``hasUsageStats``: every hard name in ``interesting`` has a ``used`` entry."""
    wanted = set(interesting)
    return all(name in used for name in hard if name in wanted)


def _status_list(q: Quota, key: str) -> dict[str, Quantity]:
    status = q.get("status")
    if status is not None and not isinstance(status, Mapping):
        raise ValueError(f"quota {quota_name(q)}: status: expected an object")
    raw = status.get(key) if isinstance(status, Mapping) else None
    try:
        return quota.parse_resource_list(raw, f"status.{key}")
    except quota.ResourceListError as error:
        raise ValueError(f"quota {quota_name(q)}: {error}") from error


def _with_used(q: Quota, used: ResourceList) -> dict[str, Any]:
    """A copy of ``q`` whose ``status.used`` is ``used``; nothing of ``q`` is shared mutably."""
    status = q.get("status")
    new_status = dict(status) if isinstance(status, Mapping) else {}
    new_status["used"] = quota.to_strings(used)
    result = dict(q)
    result["status"] = new_status
    return result


def _with_namespace(obj: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    """Upstream sets a missing namespace on the object before measuring it; we copy instead."""
    metadata = obj.get("metadata")
    if not namespace or not isinstance(metadata, Mapping) or metadata.get("namespace"):
        return obj
    return {**obj, "metadata": {**metadata, "namespace": namespace}}


# -- checkRequest --


def check_request(
    quotas: Sequence[Quota],
    attributes: Attributes,
    evaluator: Evaluator,
    limited_resources: Sequence[LimitedResource] = (),
) -> list[Quota]:
    """Upstream ``CheckRequest``: the quotas as they would be if the request were admitted.

    Returns a new list, the same length and order as ``quotas``; quotas the request charges are
    new objects with an updated ``status.used``, the others are the very objects passed in.
    Raises :class:`AdmissionDenied` when the request must be refused (403 for quota rules, 500
    when the request or a quota cannot be evaluated).
    """
    return check_request_charges(quotas, attributes, evaluator, limited_resources)[0]


def check_request_charges(
    quotas: Sequence[Quota],
    attributes: Attributes,
    evaluator: Evaluator,
    limited_resources: Sequence[LimitedResource] = (),
) -> tuple[list[Quota], dict[int, ResourceList]]:
    """:func:`check_request`, and what the request adds to each quota it changes (by index in
    ``quotas``): the amounts the charge ledger holds until the object is seen."""
    if not evaluator.handles(
        attributes.operation, attributes.subresource, attributes.old_obj, attributes.obj
    ):
        return list(quotas), {}
    try:
        return _check_request(quotas, attributes, evaluator, limited_resources)
    except AdmissionDenied:
        raise
    except ValueError as error:
        # Evaluator and parse errors are ValueErrors (ObjectError, ScopeError, ResourceListError,
        # QuantityError). Upstream returns the error itself: a 500 with its text.
        raise unknown_error(str(error)) from error


def _stored_usage(evaluator: Evaluator, old_obj: Any) -> ResourceList:
    """What the object as stored uses, which an update is charged above.

    A stored object a ClusterQuota measure fails on (it predates the measure, or got in while
    the webhook was down) cannot be charged by that measure; the update that fixes it is
    charged the measure's whole new value instead of being refused, which would leave deleting
    the object as the only fix. At worst that is more than its share until the next
    recalculation, never less.
    """
    try:
        return evaluator.usage(old_obj)
    except MeasureEvaluationError:
        if isinstance(evaluator, MeasuredEvaluator):
            return evaluator.computable_usage(old_obj)
        raise


def _check_request(
    quotas: Sequence[Quota],
    attributes: Attributes,
    evaluator: Evaluator,
    limited: Sequence[LimitedResource],
) -> tuple[list[Quota], dict[int, ResourceList]]:
    """``check_request``'s steps 2-8: the new quotas, and what was added to each changed one
    (by index), which the charge ledger keeps until the object is seen."""
    unchanged: tuple[list[Quota], dict[int, ResourceList]] = (list(quotas), {})
    if attributes.obj is None:
        raise ValueError("the request carries no object")
    input_obj = _with_namespace(attributes.obj, attributes.namespace)

    # Step 2: LimitedResources. Scopes come from every entry (upstream does not filter them by
    # group/resource); names only from the entries for this group/resource.
    limited_scopes: list[ScopeRequirement] = []
    for entry in limited:
        limited_scopes.extend(evaluator.matching_scopes(input_obj, entry.match_scopes))
    limited_names: set[str] = set()
    for_this_resource = [e for e in limited if e.group_resource == attributes.group_resource]
    if for_this_resource:
        limited_names = limited_by_default(evaluator.usage(input_obj), for_this_resource)

    # Step 3: the quotas this request is about.
    interesting: list[int] = []
    restricted_resources: set[str] = set()
    restricted_scopes: list[ScopeRequirement] = []
    for index, resource_quota in enumerate(quotas):
        name = quota_name(resource_quota)
        try:
            local_scopes = evaluator.matching_scopes(input_obj, quota_scopes(resource_quota))
        except ValueError as error:
            raise unknown_error(scope_matching_error_message(name, error)) from error
        restricted_scopes.extend(local_scopes)
        if not evaluator.matches(resource_quota, input_obj):
            continue
        hard = _status_list(resource_quota, "hard")
        restricted = evaluator.matching_resources(sorted(hard))
        try:
            evaluator.constraints(restricted, input_obj)
        except ConstraintError as error:
            raise forbidden(
                failed_quota_message(name, error, quota_kind(resource_quota))
            ) from error
        if not has_usage_stats(hard, _status_list(resource_quota, "used"), restricted):
            raise forbidden(status_unknown_message(name, restricted, quota_kind(resource_quota)))
        interesting.append(index)
        restricted_resources.update(restricted)

    # Step 4: what the object uses.
    input_usage = evaluator.usage(input_obj)
    negative = quota.is_negative(input_usage)
    if negative:
        raise forbidden(quota.negative_usage_message(negative))

    # Step 5: the charge per interesting quota.
    delta_by_index: dict[int, ResourceList] = dict.fromkeys(interesting, input_usage)
    delta_without_quota: ResourceList = {}
    if attributes.operation == Operation.CREATE and not interesting:
        delta_without_quota = input_usage
    if attributes.operation == Operation.UPDATE:
        old_obj = attributes.old_obj
        if old_obj is None:
            raise forbidden(PRIOR_VERSION_NOT_FOUND)
        if resource_version(old_obj):
            # Not a create-on-update: charge only the growth.
            delta = quota.subtract_non_negative(input_usage, _stored_usage(evaluator, old_obj))
            if not interesting:
                delta_without_quota = delta
            for index in interesting:
                # A quota that did not select the old object (a scope change) is charged the
                # full new usage, which delta_by_index already holds.
                if evaluator.matches(quotas[index], old_obj):
                    delta_by_index[index] = delta
        elif not interesting:
            delta_without_quota = input_usage

    # Step 6: drop zeros; nothing left means nothing to check or charge.
    delta_by_index = {
        index: non_zero
        for index, delta in delta_by_index.items()
        if (non_zero := quota.remove_zeros(delta))
    }
    if interesting:
        if not delta_by_index:
            return unchanged
    elif not quota.remove_zeros(delta_without_quota):
        return unchanged

    # Step 7: LimitedResources must be covered.
    uncovered = limited_names - restricted_resources
    if uncovered:
        raise forbidden(insufficient_quota_message(uncovered))
    uncovered_scopes = evaluator.uncovered_quota_scopes(limited_scopes, restricted_scopes)
    if uncovered_scopes:
        raise unknown_error(insufficient_scopes_message(uncovered_scopes))

    if not interesting:
        return unchanged

    # Step 8: charge each interesting quota, comparing only the names this request grows.
    out = list(quotas)
    charged: dict[int, ResourceList] = {}
    for index in interesting:
        charge = delta_by_index.get(index)
        if charge is None:
            continue
        resource_quota = quotas[index]
        hard = _status_list(resource_quota, "hard")
        used = _status_list(resource_quota, "used")
        requested = quota.mask(charge, hard)
        if not requested:
            continue
        new_used = quota.add(used, requested)
        allowed, exceeded = quota.less_than_or_equal(quota.mask(new_used, requested), hard)
        if not allowed:
            raise forbidden(
                exceeded_quota_message(
                    quota_name(resource_quota),
                    quota.mask(requested, exceeded),
                    quota.mask(used, exceeded),
                    quota.mask(hard, exceeded),
                    quota_kind(resource_quota),
                )
            )
        out[index] = _with_used(resource_quota, new_used)
        charged[index] = requested
    return out, charged


# -- checkQuotas, phase 1 --


@dataclass(frozen=True, slots=True)
class Request:
    """One waiting request of a batch: what is asked, and the evaluator that measures it."""

    attributes: Attributes
    evaluator: Evaluator


@dataclass(slots=True)
class BatchResult:
    """What phase 1 of ``checkQuotas`` decided for a batch.

    Every request index is either in :attr:`decisions` (final: ``None`` allowed, or the
    refusal) or in :attr:`pending` (it changed a quota, and is allowed once the changed quotas
    are written).
    """

    quotas: list[Quota]
    """The running quotas after every admitted, non-dry-run request of the batch."""
    changed: list[int]
    """Indexes of :attr:`quotas` whose ``status.used`` differs from the input: to be written."""
    decisions: dict[int, AdmissionDenied | None] = field(default_factory=dict)
    pending: list[int] = field(default_factory=list)
    charges: dict[int, dict[int, ResourceList]] = field(default_factory=dict)
    """For each pending request, what it added to each quota (by index of :attr:`quotas`)."""


def check_batch(
    quotas: Sequence[Quota],
    requests: Sequence[Request],
    limited_resources: Sequence[LimitedResource] = (),
    *,
    check: Iterable[int] | None = None,
    applies: Callable[[Request, Quota], bool] | None = None,
) -> BatchResult:
    """Phase 1 of upstream ``checkQuotas``: each request against the running quotas, in order.

    * A refused request gets its error and leaves the running quotas as they were.
    * A dry-run request is judged (and may be refused) but is never added to the totals.
    * A request that changes no quota is allowed at once.
    * A request that changes some quota becomes pending and its charge joins the totals.

    ``check`` limits the pass to some request indexes (a retry re-checks only the requests
    still pending); the others are not looked at. ``applies`` says which quotas bind which
    request, for a batch that spans namespaces (a request is judged only against its
    namespace's ResourceQuotas and the ClusterQuotas selecting its namespace); None: all.
    An unexpected exception while checking one request refuses that request with a 500 and
    does not stop the batch.
    """
    running = list(quotas)
    result = BatchResult(quotas=running, changed=[])
    indexes = range(len(requests)) if check is None else check
    for index in indexes:
        request = requests[index]
        binding = (
            list(range(len(running)))
            if applies is None
            else [i for i, q in enumerate(running) if applies(request, q)]
        )
        try:
            judged, judged_charges = check_request_charges(
                [running[i] for i in binding], request.attributes, request.evaluator,
                limited_resources,
            )  # fmt: skip
        except AdmissionDenied as denied:
            result.decisions[index] = denied
            continue
        except Exception as error:
            logger.exception("quota admission: checking %s failed", _describe(request.attributes))
            result.decisions[index] = unknown_error(f"resource quota evaluation failed: {error}")
            continue
        new_quotas = list(running)
        for position, index_in_running in enumerate(binding):
            new_quotas[index_in_running] = judged[position]
        charged = {binding[position]: amount for position, amount in judged_charges.items()}
        if request.attributes.dry_run:
            # Don't update quota for requests that correspond to dry-run requests.
            result.decisions[index] = None
            continue
        if all(new is old for new, old in zip(new_quotas, running, strict=True)):
            result.decisions[index] = None
            continue
        result.pending.append(index)
        result.charges[index] = charged
        running = new_quotas
    result.quotas = running
    result.changed = [
        i for i, (new, old) in enumerate(zip(running, quotas, strict=True)) if new is not old
    ]
    return result


def _describe(attributes: Attributes) -> str:
    gr: GroupResource = attributes.group_resource
    sub = f"/{attributes.subresource}" if attributes.subresource else ""
    return f"{attributes.operation} {gr}{sub} {attributes.namespace}/{attributes.name}"
