"""PodSet validation: what apps/v1 rejects in a ReplicaSet, worded the way the API server words it.

The validating webhook calls :func:`validate_podset` for PodSet creates and updates and denies the
request when the list is not empty. Checks and messages are upstream's:

* ``pkg/apis/apps/validation/validation.go``: ``ValidateReplicaSetSpec`` (replicas and
  minReadySeconds not negative, selector required, valid and not empty, the template) and
  ``ValidatePodTemplateSpecForReplicaSet`` (the selector selects the template's labels,
  ``restartPolicy`` Always, no ``activeDeadlineSeconds``);
* ``pkg/registry/apps/replicaset/strategy.go`` ``ValidateUpdate``: the selector is immutable
  (``ValidateImmutableField``, compared with ``apiequality.Semantic``: an absent list or map
  equals an empty one);
* ``apimachinery/pkg/apis/meta/v1/validation``: ``ValidateLabelSelector``, ``ValidateLabels``;
* ``apimachinery/pkg/util/validation``: ``IsQualifiedName``, ``IsValidLabelValue``,
  ``IsDNS1123Subdomain``, ``IsDNS1123Label`` and their ``RegexError`` wording;
* ``pkg/apis/core/validation``: the part of ``ValidatePodTemplateSpec`` listed below.

Each message is ``field.Error.Error()``: ``<path>: <type>[: <value>][: <detail>]``, the bad value
printed as the v1.37 API server prints it (numbers bare, strings quoted, maps and selectors as
compact JSON with sorted keys, a missing value as ``null``). Messages were checked against an
apps/v1 ReplicaSet on the v1.37 control plane (``hack/cluster.py``). Errors come in upstream's
order, duplicates dropped (``ErrorList.ToAggregate``).

Deliberate differences:

* Two upstream messages name the wrong kind or ours: upstream says ``empty selector is invalid for
  deployment`` for a ReplicaSet (the text is shared with Deployment) and ``activeDeadlineSeconds
  in ReplicaSet is not Supported``; tally says ``podset`` / ``PodSet``.
* Of ``ValidatePodSpec`` only the container checks that make every pod create fail are here
  (``containers`` required; each container's ``name`` required, a DNS-1123 label, unique;
  ``image`` required). The rest of the pod spec is checked by the API server when the controller
  creates pods, and a bad one shows up as ``ReplicaFailure`` / ``FailedCreate``.
* Input is the raw JSON the API server sends, so wrong types (which the CRD schema already
  rejects) are reported as errors here instead of failing to decode.

The CRD (``crds/podsets.tally.dev.yaml``) enforces the schema-level rules too (replicas ≥ 0,
selector required, not empty, immutable), so the API server rejects those before the webhook is
asked; this module is the full set, for the webhook and for tests.

Pure: no ``kopf``, ``kubernetes_asyncio`` or ``pydantic``; label selectors are parsed and
matched by :mod:`tally.machinery.selectors`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from tally.machinery import selectors
from tally.machinery.validation import (
    duplicate,
    forbidden,
    invalid,
    is_dns1123_label,
    is_label_value,
    is_qualified_name,
    not_supported,
    required,
    show,
)

__all__ = [
    "IMMUTABLE_MESSAGE",
    "KIND",
    "invalid_message",
    "validate_podset",
]

KIND: Final = "PodSet.tally.dev"
"""The qualified kind (``schema.GroupKind.String()``) that :func:`invalid_message` names."""

IMMUTABLE_MESSAGE: Final = "field is immutable"
"""``apimachinery/pkg/api/validation.FieldImmutableErrorMsg``."""

_TOTAL_ANNOTATION_SIZE_LIMIT: Final = 256 * 1024
"""``apimachinery/pkg/api/validation.TotalAnnotationSizeLimitB``: keys plus values, in bytes."""

_RESTART_POLICY_ALWAYS: Final = "Always"


def validate_podset(new: Mapping[str, Any], old: Mapping[str, Any] | None = None) -> list[str]:
    """Every reason the API server would refuse ``new`` if PodSet were apps/v1; ``[]`` if none.

    ``new`` and ``old`` are whole PodSet objects as JSON (``spec`` under the top level);
    ``old`` is given for an update, and then the selector must not have changed. Never raises:
    input of the wrong shape is reported as an error naming the field.
    """
    errors: list[str] = []
    spec = new.get("spec")
    if not isinstance(spec, Mapping):
        errors.append(required("spec"))
        return errors
    errors.extend(_validate_spec(spec))
    if old is not None:
        old_spec = old.get("spec")
        old_selector = old_spec.get("selector") if isinstance(old_spec, Mapping) else None
        new_selector = spec.get("selector")
        # ValidateImmutableField(new, old): apiequality.Semantic.DeepEqual.
        if _semantic_selector(new_selector) != _semantic_selector(old_selector):
            errors.append(invalid("spec.selector", _show_selector(new_selector), IMMUTABLE_MESSAGE))
    return _dedupe(errors)


def invalid_message(name: str, errors: Sequence[str]) -> str:
    """``apierrors.NewInvalid(...).Error()``: ``PodSet.tally.dev "<name>" is invalid: ...``.

    One error is printed as it is, several as ``[a, b]`` (``utilerrors.Aggregate``), which is
    what a client of an apps/v1 ReplicaSet would read in the response's message.
    """
    listed = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
    return f"{KIND} {json.dumps(name)} is invalid: {listed}"


# --- spec ------------------------------------------------------------------------------------


def _validate_spec(spec: Mapping[str, Any]) -> list[str]:
    """``ValidateReplicaSetSpec``, in its order."""
    errors: list[str] = []
    # Unset (or null) fields take the CRD's defaults, as they take apps/v1's.
    replicas = spec.get("replicas")
    min_ready_seconds = spec.get("minReadySeconds")
    errors.extend(_nonnegative(1 if replicas is None else replicas, "spec.replicas"))
    errors.extend(
        _nonnegative(0 if min_ready_seconds is None else min_ready_seconds, "spec.minReadySeconds")
    )

    raw_selector = spec.get("selector")
    selector_errors: list[str] = []
    if raw_selector is None:
        errors.append(required("spec.selector"))
    else:
        selector_errors = _validate_label_selector(raw_selector, "spec.selector")
        errors.extend(selector_errors)
        if _is_empty_selector(raw_selector):
            errors.append(
                invalid(
                    "spec.selector",
                    _show_selector(raw_selector),
                    "empty selector is invalid for podset",  # upstream: "... for deployment"
                )
            )

    # metav1.LabelSelectorAsSelector: nil → Nothing (matches no labels), {} → Everything.
    parsed: selectors.LabelSelector | None
    try:
        parsed = selectors.parse_label_selector(raw_selector, "spec.selector")
    except selectors.SelectorError:
        parsed = None
    if parsed is None or selector_errors:
        errors.append(
            invalid("spec.selector", _show_selector(raw_selector), "invalid label selector")
        )
        return errors  # upstream validates the template only with a usable selector
    errors.extend(_validate_template(spec.get("template"), parsed, "spec.template"))
    return errors


def _nonnegative(value: object, path: str) -> list[str]:
    """``ValidateNonnegativeField`` (plus a type check the schema normally makes)."""
    if not _is_int(value):
        return [invalid(path, show(value), "must be an integer")]
    assert isinstance(value, int)
    if value < 0:
        return [invalid(path, show(value), "must be greater than or equal to 0")]
    return []


# --- label selector --------------------------------------------------------------------------


def _validate_label_selector(raw: object, path: str) -> list[str]:
    """``metav1validation.ValidateLabelSelector`` with ``AllowInvalidLabelValueInSelector`` off."""
    if not isinstance(raw, Mapping):
        return [invalid(path, show(raw), "must be an object")]
    errors: list[str] = []
    match_labels = raw.get("matchLabels")
    if match_labels is not None:
        errors.extend(_validate_labels(match_labels, f"{path}.matchLabels"))
    expressions = raw.get("matchExpressions")
    if expressions is None:
        return errors
    if not isinstance(expressions, list):
        errors.append(invalid(f"{path}.matchExpressions", show(expressions), "must be a list"))
        return errors
    for index, expression in enumerate(expressions):
        item = f"{path}.matchExpressions[{index}]"
        if not isinstance(expression, Mapping):
            errors.append(invalid(item, show(expression), "must be an object"))
            continue
        errors.extend(_validate_requirement(expression, item))
    return errors


def _validate_requirement(expression: Mapping[str, Any], path: str) -> list[str]:
    """``ValidateLabelSelectorRequirement``: operator and values, key, each value."""
    errors: list[str] = []
    operator = expression.get("operator", "")
    values = expression.get("values") or []
    if not isinstance(values, list):
        return [invalid(f"{path}.values", show(values), "must be a list of strings")]
    if operator in ("In", "NotIn"):
        if not values:
            errors.append(
                required(f"{path}.values", "must be specified when `operator` is 'In' or 'NotIn'")
            )
    elif operator in ("Exists", "DoesNotExist"):
        if values:
            errors.append(
                forbidden(
                    f"{path}.values",
                    "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                )
            )
    else:
        errors.append(invalid(f"{path}.operator", show(operator), "not a valid selector operator"))
    key = expression.get("key", "")
    errors.extend(_label_name_errors(key, f"{path}.key"))
    for index, value in enumerate(values):
        errors.extend(_label_value_errors(value, f"{path}.values[{index}]"))
    return errors


def _is_empty_selector(raw: object) -> bool:
    """``len(MatchLabels) + len(MatchExpressions) == 0``."""
    if not isinstance(raw, Mapping):
        return False
    return not raw.get("matchLabels") and not raw.get("matchExpressions")


def _semantic_selector(raw: object) -> object:
    """A selector in a form where ``==`` is ``apiequality.Semantic.DeepEqual``.

    Absent, ``null`` and empty lists and maps compare equal; list order still matters.
    """
    if not isinstance(raw, Mapping):
        return raw
    expressions = raw.get("matchExpressions") or []
    if isinstance(expressions, list):
        expressions = [
            (e.get("key"), e.get("operator"), list(e.get("values") or []))
            if isinstance(e, Mapping)
            else e
            for e in expressions
        ]
    return (dict(raw.get("matchLabels") or {}), expressions)


# --- pod template ----------------------------------------------------------------------------


def _validate_template(template: object, selector: selectors.LabelSelector, path: str) -> list[str]:
    """``ValidatePodTemplateSpecForReplicaSet`` (and the parts of ``ValidatePodTemplateSpec``
    named in the module docstring)."""
    if template is None:
        return [required(path)]
    if not isinstance(template, Mapping):
        return [invalid(path, show(template), "must be an object")]
    errors: list[str] = []
    metadata = template.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        errors.append(invalid(f"{path}.metadata", show(metadata), "must be an object"))
        metadata = {}
    labels = metadata.get("labels")
    labels_ok = _is_string_map(labels)
    if not labels_ok:
        errors.append(invalid(f"{path}.metadata.labels", show(labels), "must be a map of strings"))
    elif not selector.is_empty() and not selector.matches(labels):
        errors.append(
            invalid(
                f"{path}.metadata.labels",
                show(labels),
                "`selector` does not match template `labels`",
            )
        )

    # ValidatePodTemplateSpec: labels, annotations, then the pod spec.
    if labels_ok and labels:
        errors.extend(_validate_labels(labels, f"{path}.labels"))
    errors.extend(_validate_annotations(metadata.get("annotations"), f"{path}.annotations"))

    pod_spec = template.get("spec")
    if pod_spec is None:
        pod_spec = {}
    if not isinstance(pod_spec, Mapping):
        errors.append(invalid(f"{path}.spec", show(pod_spec), "must be an object"))
        return errors
    errors.extend(_validate_containers(pod_spec.get("containers"), f"{path}.spec.containers"))

    # An unset restartPolicy is defaulted to Always, as it is for a ReplicaSet's template.
    restart_policy = pod_spec.get("restartPolicy")
    if restart_policy not in (None, "", _RESTART_POLICY_ALWAYS):
        errors.append(
            not_supported(f"{path}.spec.restartPolicy", restart_policy, [_RESTART_POLICY_ALWAYS])
        )
    if pod_spec.get("activeDeadlineSeconds") is not None:
        errors.append(
            forbidden(
                f"{path}.spec.activeDeadlineSeconds",
                "activeDeadlineSeconds in PodSet is not Supported",  # upstream: "in ReplicaSet"
            )
        )
    return errors


def _validate_containers(containers: object, path: str) -> list[str]:
    """The container checks of ``validateContainers`` / ``validateContainerCommon``."""
    if containers is None or containers == []:
        return [required(path)]
    if not isinstance(containers, list):
        return [invalid(path, show(containers), "must be a list")]
    errors: list[str] = []
    names: set[str] = set()
    for index, container in enumerate(containers):
        item = f"{path}[{index}]"
        if not isinstance(container, Mapping):
            errors.append(invalid(item, show(container), "must be an object"))
            continue
        name = container.get("name") or ""
        if not isinstance(name, str):
            errors.append(invalid(f"{item}.name", show(name), "must be a string"))
            name = ""
        elif not name:
            errors.append(required(f"{item}.name"))
        else:
            errors.extend(
                invalid(f"{item}.name", show(name), message) for message in is_dns1123_label(name)
            )
        image = container.get("image")
        if not image:
            errors.append(required(f"{item}.image"))
        elif not isinstance(image, str):
            errors.append(invalid(f"{item}.image", show(image), "must be a string"))
        if name in names:
            errors.append(duplicate(f"{item}.name", name))
        else:
            names.add(name)
    return errors


# --- labels and annotations ------------------------------------------------------------------


def _validate_labels(labels: object, path: str) -> list[str]:
    """``ValidateLabels``: each key a qualified name, each value a label value; errors name
    the map, not the key (upstream's ``fldPath``). Keys in sorted order (Go's are random)."""
    if not _is_string_map(labels):
        return [invalid(path, show(labels), "must be a map of strings")]
    assert isinstance(labels, Mapping)
    errors: list[str] = []
    for key in sorted(labels):
        errors.extend(_label_name_errors(key, path))
        errors.extend(_label_value_errors(labels[key], path))
    return errors


def _validate_annotations(annotations: object, path: str) -> list[str]:
    """``ValidateAnnotations``: keys are qualified names (checked lower-cased), and keys plus
    values stay within 256 KiB."""
    if annotations is None:
        return []
    if not _is_string_map(annotations):
        return [invalid(path, show(annotations), "must be a map of strings")]
    assert isinstance(annotations, Mapping)
    errors: list[str] = []
    total = 0
    for key in sorted(annotations):
        total += len(key.encode()) + len(annotations[key].encode())
        errors.extend(
            invalid(path, show(key), message) for message in is_qualified_name(key.lower())
        )
    if total > _TOTAL_ANNOTATION_SIZE_LIMIT:
        errors.append(
            f"{path}: Too long: may not be more than {_TOTAL_ANNOTATION_SIZE_LIMIT} bytes"
        )
    return errors


def _label_name_errors(key: object, path: str) -> list[str]:
    """``ValidateLabelName``."""
    if not isinstance(key, str):
        return [invalid(path, show(key), "must be a string")]
    return [invalid(path, show(key), message) for message in is_qualified_name(key)]


def _label_value_errors(value: object, path: str) -> list[str]:
    if not isinstance(value, str):
        return [invalid(path, show(value), "must be a string")]
    return [invalid(path, show(value), message) for message in is_label_value(value)]


# --- field.Error formatting ------------------------------------------------------------------


def _show_selector(raw: object) -> str:
    """A ``metav1.LabelSelector`` as Go marshals it: fields in struct order, empty ones omitted."""
    if not isinstance(raw, Mapping):
        return show(raw)
    shown: dict[str, object] = {}
    if raw.get("matchLabels"):
        shown["matchLabels"] = raw["matchLabels"]
    expressions = raw.get("matchExpressions")
    if expressions and isinstance(expressions, list):
        shown["matchExpressions"] = [_requirement_json(e) for e in expressions]
    elif expressions:
        shown["matchExpressions"] = expressions
    # sort_keys would reorder matchLabels/matchExpressions; sort only inside the label map.
    if isinstance(shown.get("matchLabels"), Mapping):
        labels = shown["matchLabels"]
        assert isinstance(labels, Mapping)
        shown["matchLabels"] = {k: labels[k] for k in sorted(labels)}
    return json.dumps(shown, separators=(",", ":"), ensure_ascii=False)


def _requirement_json(expression: object) -> object:
    if not isinstance(expression, Mapping):
        return expression
    shown: dict[str, object] = {
        "key": expression.get("key", ""),
        "operator": expression.get("operator", ""),
    }
    if expression.get("values"):
        shown["values"] = expression["values"]
    return shown


# --- helpers ---------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_string_map(value: object) -> bool:
    """``None`` counts (no labels); otherwise a map from strings to strings."""
    if value is None:
        return True
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )


def _dedupe(errors: list[str]) -> list[str]:
    """``ErrorList.ToAggregate`` drops repeated messages, keeping the first."""
    return list(dict.fromkeys(errors))
