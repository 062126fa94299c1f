"""PodSet at the boundary: pydantic models of ``podsets.tally.dev/v1alpha1`` spec and status.

STYLE §6: pydantic only where outside data enters or leaves tally. A PodSet enters as the JSON
the API server sends (``PodSet.model_validate(body)``) and its status leaves through the status
subresource (``status.model_dump(mode="json", by_alias=True, exclude_none=True)``; JSON mode
turns the tuples into lists). Python names are
snake_case, wire names camelCase (``alias_generator=to_camel``, ``validate_by_name=True``), and
every model is frozen.

``extra`` is chosen per model, as STYLE §6 asks:

* ``"forbid"`` for the spec, which is tally's own input: a misspelt field fails loudly. The pod
  template's ``spec`` is the exception, a plain ``dict`` (a core/v1 PodSpec that the API server
  validates when the controller creates pods);
* ``"ignore"`` for what the API server owns (the object envelope, ``metadata``) and for the
  status, which a newer tally may have written with fields this one does not know.

This module lives outside :mod:`tally.podset` on purpose: that package is the pure core and
imports no pydantic (``tests/unit/podset/test_podset_layering.py``). The checks apps/v1 makes on a
ReplicaSet (selector matches the template, immutable selector, containers, restartPolicy), with
upstream's messages, are :func:`tally.podset.validation.validate_podset`, which works on the raw
JSON; these models check types and ranges only, and the core keeps working on plain JSON.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt
from pydantic.alias_generators import to_camel

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "LabelSelector",
    "LabelSelectorRequirement",
    "PodSet",
    "PodSetCondition",
    "PodSetMetadata",
    "PodSetSpec",
    "PodSetStatus",
    "PodTemplateMetadata",
    "PodTemplateSpec",
]

GROUP: Final = "tally.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "PodSet"
PLURAL: Final = "podsets"

INT32_MAX: Final = 2**31 - 1
"""``spec.replicas`` and ``spec.minReadySeconds`` are ``int32`` in the CRD, as in apps/v1."""

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]


class LabelSelectorRequirement(BaseModel):
    """One ``matchExpressions`` entry (``metav1.LabelSelectorRequirement``)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, validate_by_name=True
    )

    key: str
    operator: Operator
    values: tuple[str, ...] = ()
    """Required for ``In``/``NotIn``, empty for ``Exists``/``DoesNotExist`` (checked by
    :func:`tally.podset.validation.validate_podset`, with upstream's messages)."""


class LabelSelector(BaseModel):
    """``metav1.LabelSelector``: ``matchLabels`` and ``matchExpressions``, ANDed.

    The CRD defaults both to empty, so the API server always sends them; parse and match with
    :func:`tally.machinery.selectors.parse_label_selector` on ``model_dump(by_alias=True)``.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, validate_by_name=True
    )

    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: tuple[LabelSelectorRequirement, ...] = ()


class PodTemplateMetadata(BaseModel):
    """The template metadata every pod gets. The CRD prunes everything else."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, validate_by_name=True
    )

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: tuple[str, ...] = ()


class PodTemplateSpec(BaseModel):
    """``core/v1.PodTemplateSpec`` with a free-form pod ``spec``."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, validate_by_name=True
    )

    metadata: PodTemplateMetadata = Field(default_factory=PodTemplateMetadata)
    spec: dict[str, Any] = Field(default_factory=dict)
    """A core/v1 PodSpec as JSON (camelCase), copied into every pod as it is."""


class PodSetSpec(BaseModel):
    """What the user asks for. Defaults are the CRD's (and apps/v1's)."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, validate_by_name=True
    )

    replicas: StrictInt = Field(default=1, ge=0, le=INT32_MAX)
    """Number of desired pods."""
    min_ready_seconds: StrictInt = Field(default=0, ge=0, le=INT32_MAX)
    """How long a ready pod must stay ready before it counts as available."""
    selector: LabelSelector
    """Which pods the PodSet counts and adopts. Immutable, never empty."""
    template: PodTemplateSpec
    """The pods to create."""


class PodSetCondition(BaseModel):
    """One entry of ``status.conditions`` (``ReplicaSetCondition``)."""

    model_config = ConfigDict(
        extra="ignore", frozen=True, alias_generator=to_camel, validate_by_name=True
    )

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    """RFC 3339, kept as the string the API server stores so that it round-trips exactly."""


class PodSetStatus(BaseModel):
    """What the controller observed (``ReplicaSetStatus``), written through ``/status``."""

    model_config = ConfigDict(
        extra="ignore", frozen=True, alias_generator=to_camel, validate_by_name=True
    )

    replicas: StrictInt = Field(default=0, ge=0)
    """Active pods the PodSet owns."""
    fully_labeled_replicas: StrictInt = Field(default=0, ge=0)
    """Of those, pods whose labels include every template label."""
    ready_replicas: StrictInt = Field(default=0, ge=0)
    """Of those, pods whose Ready condition is True."""
    available_replicas: StrictInt = Field(default=0, ge=0)
    """Of those, pods ready for at least ``minReadySeconds``."""
    terminating_replicas: StrictInt | None = Field(default=None, ge=0)
    """Owned pods being deleted that have not terminated yet."""
    observed_generation: StrictInt = Field(default=0, ge=0)
    """The ``metadata.generation`` this status was computed for."""
    conditions: tuple[PodSetCondition, ...] = ()
    selector: str | None = None
    """``spec.selector`` as a string (``LabelSelectorAsSelector(...).String()``), which the scale
    subresource publishes for ``kubectl scale`` and HorizontalPodAutoscalers."""


class PodSetMetadata(BaseModel):
    """The parts of ``ObjectMeta`` tally reads. The API server owns the rest."""

    model_config = ConfigDict(
        extra="ignore", frozen=True, alias_generator=to_camel, validate_by_name=True
    )

    name: str = ""
    namespace: str = ""
    uid: str = ""
    generation: int = 0
    resource_version: str = ""
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class PodSet(BaseModel):
    """A whole ``PodSet`` object as the API server sends it."""

    model_config = ConfigDict(
        extra="ignore", frozen=True, alias_generator=to_camel, validate_by_name=True
    )

    api_version: Literal["tally.dev/v1alpha1"] = "tally.dev/v1alpha1"
    kind: Literal["PodSet"] = "PodSet"
    metadata: PodSetMetadata = Field(default_factory=PodSetMetadata)
    spec: PodSetSpec
    status: PodSetStatus | None = None
