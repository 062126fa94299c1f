"""Discovery: which resources the API server serves, and whether quota can count them
(upstream's ``GetQuotableResources`` in ``resource_quota_controller.go``, asked per resource).

:class:`Discovery` resolves a group/resource named as ``count/<r>[.<g>]`` through the
discovery documents: ``/api/v1``, or ``/apis/<group>`` for the preferred version then
``/apis/<group>/<version>``. It must exist, be namespaced, and support list, watch, create and
delete (:data:`REQUIRED_VERBS`); otherwise the answer is a
:class:`~tally.resourcequota.reporting.Problem` saying why not. A 403 or 404 is such an
answer; a transient failure (5xx, connection) is a :class:`DiscoveryError`, which changes
nothing and is retried at the next period.

Its own module because it only reads documents: the documents are parsed by plain functions
over plain data, and resolution runs over an injectable fetch function, so all of it is tested
without a cluster. What is watched, when, and with what is
:class:`tally.resourcequota.monitor.DynamicKinds`'s business.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tally.evaluators.base import GroupResource
from tally.kube.reflector import ResourceRef, StatusError
from tally.resourcequota.reporting import (
    REASON_FORBIDDEN,
    REASON_UNKNOWN_RESOURCE,
    REASON_UNSUPPORTED,
    Problem,
)

Obj = Mapping[str, Any]


REQUIRED_VERBS: Final = frozenset({"create", "list", "watch", "delete"})
"""Upstream ``GetQuotableResources``: a resource quota can count must support these."""


# -- pure: discovery documents


@dataclass(frozen=True, slots=True)
class DiscoveredResource:
    """One resource as an ``APIResourceList`` describes it."""

    group: str
    version: str
    resource: str
    verbs: frozenset[str]
    namespaced: bool

    @property
    def group_resource(self) -> GroupResource:
        return GroupResource(self.group, self.resource)

    @property
    def ref(self) -> ResourceRef:
        return ResourceRef(self.group, self.version, self.resource)


def split_group_version(group_version: str) -> tuple[str, str]:
    """``"apps/v1"`` -> ``("apps", "v1")``; ``"v1"`` -> ``("", "v1")``."""
    group, _, version = group_version.rpartition("/")
    return group, version


def parse_resource_list(doc: Obj) -> dict[GroupResource, DiscoveredResource]:
    """The resources of an ``APIResourceList`` (``/api/v1``, ``/apis/<g>/<v>``), subresources
    (``pods/status``) left out."""
    group, version = split_group_version(str(doc.get("groupVersion") or ""))
    found: dict[GroupResource, DiscoveredResource] = {}
    for entry in doc.get("resources") or ():
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not name or "/" in name:
            continue
        verbs = entry.get("verbs") or ()
        resource = DiscoveredResource(
            group=group,
            version=version,
            resource=name,
            verbs=frozenset(str(verb) for verb in verbs if isinstance(verb, str)),
            namespaced=bool(entry.get("namespaced")),
        )
        found[resource.group_resource] = resource
    return found


def group_versions(doc: Obj) -> list[str]:
    """The versions of an ``APIGroup`` document (``/apis/<group>``), preferred first."""
    versions = [
        str(entry.get("version"))
        for entry in doc.get("versions") or ()
        if isinstance(entry, Mapping) and entry.get("version")
    ]
    preferred = (doc.get("preferredVersion") or {}).get("version")
    if isinstance(preferred, str) and preferred:
        versions = [preferred, *(version for version in versions if version != preferred)]
    return versions


def quotable_problem(resource: DiscoveredResource) -> Problem | None:
    """Why quota cannot count ``resource``, or None if it can."""
    missing = sorted(REQUIRED_VERBS - resource.verbs)
    if missing:
        return Problem(
            REASON_UNSUPPORTED,
            f"{resource.group_resource} does not support {', '.join(missing)}; "
            "object count quota needs create, list, watch and delete",
        )
    if not resource.namespaced:
        return Problem(
            REASON_UNSUPPORTED,
            f"{resource.group_resource} is cluster-scoped; quota counts namespaced objects only",
        )
    return None


# -- discovery over a fetch function


class DiscoveryError(Exception):
    """A discovery GET failed without telling anything about the resource (5xx, network)."""


Fetch = Callable[[str], Awaitable[Obj]]
"""GET an API path as JSON; raises :class:`StatusError` for HTTP errors."""


class Discovery:
    """Resolves group/resources through discovery, caching each document for one pass.

    Make a new one per pass: documents go stale (a CRD deleted, a version added).
    """

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._documents: dict[str, Obj | StatusError] = {}

    async def _get(self, path: str) -> Obj:
        cached = self._documents.get(path)
        if cached is None:
            try:
                cached = await self._fetch(path)
            except StatusError as error:
                if error.code not in (403, 404):
                    raise DiscoveryError(f"GET {path}: {error}") from error
                cached = error
            self._documents[path] = cached
        if isinstance(cached, StatusError):
            raise cached
        return cached

    async def resolve(self, gr: GroupResource) -> DiscoveredResource | Problem:
        """The resource as served (preferred version first), or why it is not countable.

        Raises :class:`DiscoveryError` when the answer is unknown (a transient failure).
        """
        try:
            if not gr.group:
                versions = ["v1"]
            else:
                versions = group_versions(await self._get(f"/apis/{gr.group}"))
            for version in versions:
                path = f"/api/{version}" if not gr.group else f"/apis/{gr.group}/{version}"
                resource = parse_resource_list(await self._get(path)).get(gr)
                if resource is not None:
                    return quotable_problem(resource) or resource
        except StatusError as error:
            if error.code == 403:
                return Problem(REASON_FORBIDDEN, f"discovery of {gr} is forbidden: {error}")
            return Problem(REASON_UNKNOWN_RESOURCE, f"the API server does not serve {gr}")
        return Problem(REASON_UNKNOWN_RESOURCE, f"the API server does not serve {gr}")


def problem_for_failure(gr: GroupResource, error: StatusError) -> Problem:
    """What a reflector's fatal LIST/WATCH status means for the quotas naming ``gr``."""
    if error.code == 403:
        return Problem(REASON_FORBIDDEN, f"listing or watching {gr} is forbidden: {error}")
    if error.code == 404:
        return Problem(REASON_UNKNOWN_RESOURCE, f"{gr} is no longer served: {error}")
    return Problem(REASON_UNSUPPORTED, f"{gr} cannot be listed and watched: {error}")
