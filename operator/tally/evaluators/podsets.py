"""PodSet measures: what a PodSet may scale to, as quota resource names.

Pod quotas alone refuse a scale-up pod by pod, after the fact: ``kubectl scale podset web
--replicas=50`` is accepted and the PodSet then reports ``ReplicaFailure``, far from whoever
typed it. This evaluator measures a PodSet by what its pods will use: the pod evaluator's own
figures for ``spec.template`` (the same formula a pod is charged by), times ``spec.replicas``,
under the prefix ``podsets.tally.dev/``:

* ``podsets.tally.dev/pods`` — the replicas;
* ``podsets.tally.dev/requests.cpu``, ``…/limits.memory``, ``…/cpu``, ``…/hugepages-2Mi``,
  ``…/requests.example.com/dongle`` — every compute name the pod evaluator knows, times the
  replicas (a name with a second ``/``, an extended resource, fits a ClusterQuota only: the
  API server refuses it in a ResourceQuota);
* ``count/podsets.tally.dev`` — one per PodSet, as any object count.

A quota naming these charges a PodSet when it is created, when its spec grows (by the growth),
and when its ``scale`` subresource is written (admission judges the PodSet as it will be after
the scale). Pods the PodSet creates are charged again under the pod names (``pods``,
``requests.cpu``): these are different names, so nothing is counted twice under one name; a
quota meant to cap PodSets names the ``podsets.tally.dev/`` names, one meant to cap running
pods names the pod names, and one may name both.

What the template cannot say is not counted: a RuntimeClass's pod overhead (admission adds it
to each pod, not to the template) and values a mutating webhook adds to pods.

Scopes do not apply to PodSets (like object counts): a scoped quota does not measure them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from tally.evaluators import base
from tally.evaluators.base import (
    GroupResource,
    Obj,
    ObjectError,
    Operation,
    ScopeRequirement,
    get_mapping,
)
from tally.evaluators.pods import POD_OBJECT_COUNT_NAME, PodEvaluator, project_pod
from tally.quota.quantity import Quantity
from tally.quota.resources import ResourceList

__all__ = ["MEASURE_PREFIX", "PODSETS", "PodSetEvaluator", "scaled"]

PODSETS: Final = GroupResource("tally.dev", "podsets")
MEASURE_PREFIX: Final = "podsets.tally.dev/"
"""The prefix of every PodSet measure: ``podsets.tally.dev/<pod resource name>``."""
COUNT_NAME: Final = "count/podsets.tally.dev"
SCALE: Final = "scale"
_ONE: Final = Quantity.from_int(1)


def _replicas(podset: Obj) -> int:
    """``spec.replicas``; 1 when unset, as the API server defaults a ReplicaSet's."""
    value = get_mapping(podset, "spec").get("replicas")
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ObjectError("spec.replicas", f"expected a non-negative integer, got {value!r}")
    return value


def scaled(podset: Obj, scale: Obj) -> dict[str, Any]:
    """``podset`` as it is after a write of its ``scale`` subresource: ``scale``'s
    ``spec.replicas`` and ``metadata.resourceVersion`` (the PodSet's, which the Scale carries),
    everything else unchanged. A Scale without ``spec.replicas`` means 0: autoscaling/v1
    leaves a zero out (``omitempty``)."""
    replicas = get_mapping(scale, "spec").get("replicas") or 0
    metadata = dict(get_mapping(podset, "metadata"))
    version = get_mapping(scale, "metadata").get("resourceVersion")
    if version:
        metadata["resourceVersion"] = version
    return {
        **podset,
        "metadata": metadata,
        "spec": {**get_mapping(podset, "spec"), "replicas": replicas},
    }


class PodSetEvaluator(base.NoScopes):
    """Measures PodSets: ``count/podsets.tally.dev`` and the ``podsets.tally.dev/`` names."""

    handled_operations: Final = base.handled(
        [Operation.CREATE, Operation.UPDATE], scale=[Operation.UPDATE]
    )
    """The ``scale`` subresource too: ``kubectl scale`` writes it, and a scale-up past a
    PodSet measure's limit must reach admission."""

    def __init__(self) -> None:
        # Only for which names exist; usage comes from project_pod, which has no clock.
        self._pods = PodEvaluator()

    @property
    def group_resource(self) -> GroupResource:
        return PODSETS

    def project(self, obj: Obj) -> Obj:
        """PodSets are kept whole: the PodSet controller shares their cache."""
        return obj

    def matching_resources(self, names: Iterable[str]) -> list[str]:
        result: list[str] = []
        for name in names:
            if name == COUNT_NAME:
                result.append(name)
            elif name.startswith(MEASURE_PREFIX):
                inner = name[len(MEASURE_PREFIX) :]
                if inner != POD_OBJECT_COUNT_NAME and self._pods.matching_resources([inner]):
                    result.append(name)
        return result

    def usage(self, obj: Any) -> ResourceList:
        """One PodSet, and the template's pod usage times the replicas."""
        if not isinstance(obj, Mapping):
            raise ObjectError("podset", f"expected an object, got {type(obj).__name__}")
        replicas = _replicas(obj)
        template = get_mapping(get_mapping(obj, "spec"), "template", "spec.template")
        pod = {
            "metadata": get_mapping(template, "metadata", "spec.template.metadata"),
            "spec": get_mapping(template, "spec", "spec.template.spec"),
        }
        try:
            items = project_pod(pod).usage_items
        except ObjectError as error:
            raise ObjectError(f"spec.template.{error.field}", error.reason) from error
        result: dict[str, Quantity] = {COUNT_NAME: _ONE}
        for name, quantity in items:
            if name != POD_OBJECT_COUNT_NAME:
                result[MEASURE_PREFIX + name] = Quantity(quantity.nanos * replicas, quantity.format)
        return result

    def constraints(self, required: Iterable[str], obj: Obj) -> None:
        """None: a template without requests is measured as zero, as a pod would be."""

    def handles(self, operation: str, subresource: str, old: Obj | None, new: Obj | None) -> bool:
        """CREATE; UPDATE of the spec or of the ``scale`` subresource (by its growth)."""
        if subresource == "":
            return operation in (Operation.CREATE, Operation.UPDATE)
        return subresource == SCALE and operation == Operation.UPDATE

    def usage_stats(
        self, objects: Iterable[Any], resources: Iterable[str], scopes: Sequence[ScopeRequirement]
    ) -> dict[str, Quantity]:
        return base.scoped_usage_stats(self, objects, resources, scopes)

    def requires_replenishment(self, old: Any, new: Any) -> bool:
        """When some name's usage went down (fewer replicas, a smaller template)."""
        try:
            before, after = self.usage(old), self.usage(new)
        except ObjectError:
            return True
        return any(after.get(name, _ZERO) < value for name, value in before.items())


_ZERO: Final = Quantity(0)
