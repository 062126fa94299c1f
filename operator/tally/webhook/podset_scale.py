"""A write of a PodSet's ``scale`` judged as the PodSet it resizes.

The API server sends the quota webhook an ``autoscaling/v1`` Scale for ``podsets/scale``:
replicas only, no template, so nothing a quota counts. Before admission judges it, the request
is turned into the PodSet as it is and as it will be (:func:`tally.evaluators.podsets.scaled`),
read from the cache, or from the API when the cache does not have it yet (a PodSet created a
moment ago and scaled at once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from tally.admission.attributes import Attributes
from tally.admission.errors import internal_error
from tally.evaluators.base import GroupResource
from tally.evaluators.podsets import SCALE, scaled

Obj = Mapping[str, Any]


class ScaledPodSets:
    """Turns a review of ``podsets/scale`` into one of the PodSet it scales."""

    def __init__(
        self,
        podsets: GroupResource,
        cached: Callable[[str, str], Obj | None],
        read: Callable[[str, str], Awaitable[Obj | None]],
    ) -> None:
        """``cached``/``read``: the PodSet by namespace and name from the cache / the API
        (None: no such PodSet)."""
        self._podsets = podsets
        self._cached = cached
        self._read = read

    async def resolve(self, attributes: Attributes) -> Attributes | None:
        """``attributes`` as admission should judge them; None for a scale of a PodSet that
        does not exist (nothing to charge: the API server answers 404)."""
        if attributes.group_resource != self._podsets or attributes.subresource != SCALE:
            return attributes
        if attributes.obj is None or attributes.old_obj is None:
            return attributes
        podset = self._cached(attributes.namespace, attributes.name)
        if podset is None:
            try:
                podset = await self._read(attributes.namespace, attributes.name)
            except client.ApiException as error:
                raise internal_error(f"reading the PodSet to scale: {error.reason}") from error
            if podset is None:
                return None
        return dataclasses.replace(
            attributes,
            obj=scaled(podset, attributes.obj),
            old_obj=scaled(podset, attributes.old_obj),
        )
