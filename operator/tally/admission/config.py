"""Upstream's ``ResourceQuotaConfiguration``: resources that may only be consumed under a quota.

The ResourceQuota admission plugin reads an optional configuration file::

    apiVersion: apiserver.config.k8s.io/v1
    kind: ResourceQuotaConfiguration
    limitedResources:
    - resource: pods
      matchContains: ["requests.cpu"]        # names of the usage that need a covering quota
      matchScopes:                           # object scopes that need a covering quota
      - {scopeName: PriorityClass, operator: In, values: ["cluster-services"]}

This module parses that document (already loaded from YAML or JSON by the caller) into frozen
dataclasses and validates it, with an error that names the field. It follows
``apis/resourcequota/v1/types.go`` and ``validation.go`` (``resource`` is required), and also
accepts the older ``resourcequota.admission.k8s.io/v1beta1`` and ``v1alpha1`` documents of kind
``Configuration``, which have the same fields.

Where tally is stricter than upstream, on purpose (this is an input the operator's owner
writes, so a typo must fail loudly rather than silently lift a limit): unknown fields are
rejected (upstream's decoder drops them), and each ``matchScopes`` entry is validated like a
quota's ``scopeSelector`` expression (upstream does not validate them).

Left out: reading the file (the caller does), and upstream's ``AdmissionConfiguration`` wrapper
(the ``plugins[].configuration`` list of kube-apiserver's ``--admission-control-config-file``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from tally.evaluators.base import GroupResource, ScopeError, ScopeRequirement
from tally.evaluators.base import parse_scope_requirement as _parse_scope

__all__ = [
    "ACCEPTED_TYPES",
    "Configuration",
    "ConfigurationError",
    "LimitedResource",
    "parse_configuration",
]

ACCEPTED_TYPES: Final = frozenset(
    {
        ("apiserver.config.k8s.io/v1", "ResourceQuotaConfiguration"),
        ("resourcequota.admission.k8s.io/v1beta1", "Configuration"),
        ("resourcequota.admission.k8s.io/v1alpha1", "Configuration"),
    }
)
"""(apiVersion, kind) pairs upstream's scheme decodes into a ResourceQuota configuration."""

_TOP_LEVEL_FIELDS: Final = frozenset({"apiVersion", "kind", "limitedResources"})
_LIMITED_RESOURCE_FIELDS: Final = frozenset(
    {"apiGroup", "resource", "matchContains", "matchScopes"}
)


class ConfigurationError(ValueError):
    """The configuration document is invalid; ``field`` is the path of the offending field."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


@dataclass(frozen=True, slots=True)
class LimitedResource:
    """One ``limitedResources`` entry: consumption of ``group_resource`` needs a covering quota."""

    api_group: str
    """``apiGroup``; ``""`` is the core group."""
    resource: str
    """``resource``, the plural name, e.g. ``pods`` or ``persistentvolumeclaims``."""
    match_contains: tuple[str, ...] = ()
    """Usage names containing any of these substrings must be covered by a matching quota."""
    match_scopes: tuple[ScopeRequirement, ...] = ()
    """Objects matching any of these scopes must be covered by a quota with that scope."""

    @property
    def group_resource(self) -> GroupResource:
        return GroupResource(self.api_group, self.resource)


@dataclass(frozen=True, slots=True)
class Configuration:
    """Upstream ``resourcequotaapi.Configuration``; the default limits nothing."""

    limited_resources: tuple[LimitedResource, ...] = ()


def parse_configuration(raw: object) -> Configuration:
    """Validate a loaded ``ResourceQuotaConfiguration`` document; ``None`` is the default.

    Raises :class:`ConfigurationError` naming the first bad field.
    """
    if raw is None:
        return Configuration()
    if not isinstance(raw, Mapping):
        raise ConfigurationError("", f"expected an object, got {type(raw).__name__}")
    _reject_unknown(raw, _TOP_LEVEL_FIELDS, "")
    api_version, kind = raw.get("apiVersion"), raw.get("kind")
    if (api_version, kind) not in ACCEPTED_TYPES:
        accepted = ", ".join(f"{v}/{k}" for v, k in sorted(ACCEPTED_TYPES))
        raise ConfigurationError(
            "apiVersion/kind", f"unsupported type {api_version!r}/{kind!r} (accepted: {accepted})"
        )
    entries = raw.get("limitedResources")
    if entries is None:
        return Configuration()
    if not isinstance(entries, list):
        raise ConfigurationError(
            "limitedResources", f"expected a list, got {type(entries).__name__}"
        )
    return Configuration(
        tuple(
            _parse_limited_resource(entry, f"limitedResources[{i}]")
            for i, entry in enumerate(entries)
        )
    )


def _parse_limited_resource(raw: object, field: str) -> LimitedResource:
    if not isinstance(raw, Mapping):
        raise ConfigurationError(field, f"expected an object, got {type(raw).__name__}")
    _reject_unknown(raw, _LIMITED_RESOURCE_FIELDS, field)
    api_group = _optional_str(raw, "apiGroup", field)
    resource = _optional_str(raw, "resource", field)
    if not resource:
        # upstream validation.ValidateConfiguration: field.Required(idxPath.Child("resource"))
        raise ConfigurationError(f"{field}.resource", "Required value")
    match_contains = _string_list(raw.get("matchContains"), f"{field}.matchContains")
    scopes_raw = raw.get("matchScopes")
    if scopes_raw is None:
        scopes_raw = []
    if not isinstance(scopes_raw, list):
        raise ConfigurationError(
            f"{field}.matchScopes", f"expected a list, got {type(scopes_raw).__name__}"
        )
    scopes: list[ScopeRequirement] = []
    for index, scope in enumerate(scopes_raw):
        scope_field = f"{field}.matchScopes[{index}]"
        try:
            scopes.append(_parse_scope(scope, scope_field))
        except ScopeError as error:
            raise ConfigurationError(scope_field, str(error)) from error
    return LimitedResource(api_group, resource, tuple(match_contains), tuple(scopes))


def _reject_unknown(raw: Mapping[object, object], known: frozenset[str], field: str) -> None:
    unknown = sorted(str(key) for key in raw if key not in known)
    if unknown:
        prefix = f"{field}." if field else ""
        raise ConfigurationError(
            f"{prefix}{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})"
        )


def _optional_str(raw: Mapping[object, object], key: str, field: str) -> str:
    value = raw.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigurationError(f"{field}.{key}", f"expected a string, got {type(value).__name__}")
    return value


def _string_list(value: object, field: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigurationError(field, f"expected a list of strings, got {value!r}")
    return list(value)


def load_configuration(path: str) -> Configuration | None:
    """``TALLY_ADMISSION_CONFIG``: the file's configuration; None without a path."""
    if not path:
        return None
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"TALLY_ADMISSION_CONFIG={path!r}: {error}") from error
    return parse_configuration(raw)
