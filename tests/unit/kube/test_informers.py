"""tally.kube.informers.KubeInformers: which kinds' first Kopf listing has yet to arrive."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tally.evaluators.base import GroupResource
from tally.kube.informers import KubeInformers

pytestmark = pytest.mark.unit

PODS = GroupResource("", "pods")
SECRETS = GroupResource("", "secrets")
NAMESPACES = GroupResource("", "namespaces")


def obj(name: str, namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "uid": f"u-{name}", "resourceVersion": "1"}
    if namespace is not None:
        metadata["namespace"] = namespace
    return {"metadata": metadata}


def test_listings_pending_names_each_kind_until_kopf_delivered_what_was_listed() -> None:
    # No request is made: the API client only builds the listers, which are never called.
    # Kinds are named as upstream prints a GroupResource (the core group: the resource alone).
    caches = KubeInformers(
        cast(Any, None),
        versions={},
        cluster_scoped=frozenset({NAMESPACES}),
        optional=frozenset(),
        namespaces=frozenset(),
    )
    caches.add(PODS, lambda o: o["metadata"]["name"])
    caches.add_view(PODS, "pods-by-owner", lambda o: None)
    caches.add(SECRETS, lambda o: None)
    caches.add(NAMESPACES, lambda o: None)
    for name in ("p", "q"):
        caches.informers[PODS].store.upsert(obj(name, "a"))
    caches.informers[NAMESPACES].store.upsert(obj("a", None))
    caches.expect_listings()
    # secrets held nothing: nothing to wait for.
    assert caches.listings_pending() == [("namespaces", 1, 1), ("pods", 2, 2)]
    caches.on_event(PODS, None, obj("p", "a"))
    caches.on_event(NAMESPACES, None, obj("a", None))
    assert caches.listings_pending() == [("pods", 1, 2)]
    caches.on_event(PODS, None, obj("q", "a"))
    assert caches.listings_pending() == []
