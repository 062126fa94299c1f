"""Every kind tally tracks, as informers LISTed through the API: upstream's informer factory.

Kopf delivers the watch events; this module gives each kind its LIST (paged, per watched
namespace or cluster-wide), the synced point for a set of kinds at once, second views of one
kind fed by the same events and the same LIST pages (the PodSet controller's compact pods
beside quota's), and the one reaction to a watch gap: every synced kind re-lists
(:mod:`tally.machinery.informers` says why one kind's gap is every kind's).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from kubernetes_asyncio import client

from tally.evaluators.base import GroupResource
from tally.kube import rest
from tally.machinery.cache import Store
from tally.machinery.informers import Informer, Lister

Projection = Callable[[Any], Any]


def lister(
    api: client.ApiClient,
    gr: GroupResource,
    version: str,
    namespaces: Iterable[str | None],
    *,
    optional: bool = False,
    streamed: bool = False,
) -> Lister:
    """A paged LIST of ``gr`` in each of ``namespaces`` (None: all at once), or with
    ``streamed`` the same state as the API server streams it (:func:`tally.kube.rest.
    stream_list`, which says why). ``optional``: a kind whose CRD may be missing, which lists as
    no objects (Kopf starts watching it when it appears, and those events fill the store)."""
    listed = list(namespaces)
    pages = rest.stream_list if streamed else rest.list_pages

    async def list_kind() -> AsyncIterator[list[dict[str, Any]]]:
        try:
            for namespace in listed:
                async for page in pages(api, gr.group, version, gr.resource, namespace=namespace):
                    yield page
        except client.ApiException as error:
            if error.status == 404 and optional:
                return
            raise

    return list_kind


class KubeInformers:
    """One informer per tracked kind, and second views of a kind; fed by :meth:`on_event`."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        versions: Mapping[GroupResource, str],
        cluster_scoped: frozenset[GroupResource],
        optional: frozenset[GroupResource],
        namespaces: frozenset[str],
        streamed: bool = False,
    ) -> None:
        """``versions``: the version each kind is read at (default v1); ``optional``: kinds
        whose CRD may be missing; ``namespaces``: the namespaces tally manages (empty: all);
        ``streamed``: the API server streams a watch's initial state, and every kind is listed
        so (:func:`tally.kube.rest.stream_list`)."""
        self.api = api
        self._versions = versions
        self._cluster_scoped = cluster_scoped
        self._optional = optional
        self._namespaces = namespaces
        self._streamed = streamed
        self.informers: dict[GroupResource, Informer[Any]] = {}

    def add(
        self,
        gr: GroupResource,
        projection: Projection,
        reproject: Callable[[Any, Any], Any] | None = None,
    ) -> Informer[Any]:
        """The informer of ``gr``, whose store keeps ``projection`` of each object
        (``reproject``: of an update, from the previous projection; see ``Store``)."""
        informer: Informer[Any] = Informer(
            str(gr), Store(projection, reproject=reproject, name=str(gr)), self._lister(gr)
        )
        informer.on_gap = self.relist_all
        self.informers[gr] = informer
        return informer

    def add_view(
        self,
        gr: GroupResource,
        name: str,
        projection: Projection,
        *,
        reproject: Callable[[Any, Any], Any] | None = None,
    ) -> Informer[Any]:
        """A second store of ``gr``'s objects, fed by the same events and LIST pages as its
        informer's (its re-lists too); ``reproject`` as :class:`Store` takes it."""
        store: Store[Any] = Store(projection, reproject=reproject, name=name)
        view: Informer[Any] = Informer(name, store, self._lister(gr))
        view.on_gap = self.relist_all
        self.informers[gr].add_view(view)
        return view

    def all(self) -> list[Informer[Any]]:
        return [*self.informers.values(), *(v for i in self.informers.values() for v in i.views)]

    def _lister(self, gr: GroupResource) -> Lister:
        # None: all namespaces at once (and the only choice for cluster-scoped kinds).
        namespaces: list[str | None] = (
            [None] if gr in self._cluster_scoped else [*sorted(self._namespaces)] or [None]
        )
        return lister(
            self.api,
            gr,
            self._versions.get(gr, "v1"),
            namespaces,
            optional=gr in self._optional,
            streamed=self._streamed,
        )

    async def sync(self, kinds: Iterable[GroupResource]) -> None:
        """The synced point of ``kinds``: each LISTed once, its views from the same pages."""
        await asyncio.gather(*(self.informers[gr].sync() for gr in kinds))

    def relisting(self) -> list[str]:
        """The kinds whose re-list is scheduled or under way, by name."""
        return sorted(str(gr) for gr, informer in self.informers.items() if informer.relisting)

    def expect_listings(self) -> None:
        """Kopf's watches begin after now, each with a listing of its kind: from here on,
        :meth:`listings_pending` tells how much of them has arrived."""
        for informer in self.informers.values():
            informer.expect_listing()

    def listings_pending(self) -> list[tuple[str, int, int]]:
        """The kinds whose first Kopf listing has not all arrived: (name, objects still to
        come, objects held when the watch began), by name. Views are fed the same events as
        their informer, so only informers are asked."""
        pending = []
        for gr, informer in self.informers.items():
            listing = informer.listing
            if listing is None or listing.done:
                continue
            remaining = listing.remaining()
            if remaining:
                pending.append((str(gr), remaining, listing.total))
        return sorted(pending)

    def relist_all(self, since: float | None = None) -> None:
        """Kopf re-listed one kind after a watch gap seen at ``since`` (the informers' clock):
        every synced kind not LISTed since re-lists too. Kopf's re-list of a kind whose objects
        were all deleted during the gap delivers no event, so that kind's informer cannot see
        the gap itself (its ghosts would count forever). Without ``since`` (start-up: Kopf's
        first listings come after tally's own LISTs), every synced kind."""
        for informer in self.all():
            if informer.synced:
                informer.schedule_relist(unless_listed_since=since)

    def on_event(self, gr: GroupResource, event_type: str | None, obj: Mapping[str, Any]) -> None:
        if (
            self._namespaces
            and gr not in self._cluster_scoped
            and (obj.get("metadata") or {}).get("namespace") not in self._namespaces
        ):
            return  # Kopf may watch more than tally manages (TALLY_NAMESPACES)
        informer = self.informers.get(gr)
        if informer is None:
            return
        informer.on_event(event_type, obj)
        for view in informer.views:
            view.on_event(event_type, obj)

    async def stop(self) -> None:
        for informer in self.all():
            await informer.stop()
