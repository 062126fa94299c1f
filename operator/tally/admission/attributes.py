"""What quota admission knows about one request: upstream's ``admission.Attributes``, reduced.

The webhook adapter builds an :class:`Attributes` from an AdmissionReview request (``namespace``,
``name``, ``resource`` → :attr:`group_resource`, ``subResource``, ``operation``, ``object``,
``oldObject``, ``dryRun``) and hands it to :meth:`QuotaEvaluator.evaluate
<tally.admission.evaluator.QuotaEvaluator.evaluate>`. Objects stay API JSON mappings, the form
the evaluators read.

Left out: the kind, user info and options. Upstream uses the kind only to recognise Namespace
creation; here :func:`is_namespace_creation` looks at the group/resource ``namespaces``, which
names the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from tally.evaluators.base import GroupResource, Operation

__all__ = ["NAMESPACES", "Attributes", "is_namespace_creation", "resource_version"]

NAMESPACES: Final = GroupResource("", "namespaces")


@dataclass(frozen=True, slots=True)
class Attributes:
    """One admission request, as quota admission sees it. Read-only, like everything it holds."""

    namespace: str
    """``request.namespace``; ``""`` for cluster-scoped objects (the name, for a Namespace)."""
    name: str
    """``request.name``; may be ``""`` on CREATE with ``generateName``."""
    group_resource: GroupResource
    """``request.resource`` without the version, e.g. ``GroupResource("", "pods")``."""
    subresource: str
    """``request.subResource``; ``""`` for the main resource (e.g. ``"resize"``, ``"status"``)."""
    operation: str
    """``CREATE``, ``UPDATE``, ``DELETE`` or ``CONNECT`` (an :class:`Operation` value)."""
    obj: Mapping[str, Any] | None
    """The new object (``request.object``), API JSON; ``None`` for DELETE and CONNECT."""
    old_obj: Mapping[str, Any] | None = None
    """The stored object an UPDATE replaces (``request.oldObject``), API JSON."""
    dry_run: bool = False
    """``request.dryRun``: judge the request but never charge it to a quota."""


def is_namespace_creation(attributes: Attributes) -> bool:
    """Upstream ``isNamespaceCreation``: a CREATE of a Namespace (never quota-checked)."""
    return attributes.operation == Operation.CREATE and attributes.group_resource == NAMESPACES


def resource_version(obj: Mapping[str, Any] | None) -> str:
    """``metadata.resourceVersion`` of an API object, ``""`` when missing or not a string."""
    if not isinstance(obj, Mapping):
        return ""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return ""
    value = metadata.get("resourceVersion")
    return value if isinstance(value, str) else ""
