"""ClusterQuota status writes: the compare-and-swap PUT of ``clusterquotas/<name>/status``.

One writer for the usage controller and for admission's charges, so that both read back this
process's own last write (:class:`~tally.machinery.cache.RecentWrites`, as the updated-quotas
LRU does for ResourceQuotas): a ClusterQuota's watch event lags the write, and a pass that
started from the older copy would lose its compare-and-swap (or, for admission, judge against
a total that misses its own last charge).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

from kubernetes_asyncio import client

from tally.kube import rest
from tally.machinery.cache import RecentWrites
from tally.machinery.errors import Conflict, NotFound, TooLarge, encoded_size
from tally.quota.identity import QuotaKey, cluster_quota_key

Obj = Mapping[str, Any]

GROUP: Final = "tally.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "clusterquotas"
RECENT_WRITES: Final = 100


class WriteTracker(Protocol):
    """Told of each status write, so that watch events can be told apart as this process's
    own (:class:`~tally.charges.own_writes.OwnWrites`)."""

    def writing(self, key: QuotaKey) -> None: ...

    def wrote(self, key: QuotaKey, stored: Obj | None) -> None: ...


TOO_LARGE_MESSAGES: Final = ("request is too large", "larger than max")
"""What the API server answers (500) when etcd refuses an object for its size: etcd's request
limit ("etcdserver: request is too large", 1.5 MiB by default) or its gRPC message limit
("trying to send message larger than max", 2 MiB). Past its own body limit (3 MiB) it answers
413."""
SPLIT_HINT: Final = (
    "it lists every namespace that uses something: select fewer namespaces, or split the "
    "ClusterQuota"
)
"""What a status refused for its size tells the user to do."""
REFUSED_SIZE_MEMORY_S: Final = 300.0
"""How long the size of a status the API server refused is remembered. A status at least as
large is then refused here without being sent: the API server reads, decodes and validates
each body before etcd refuses it (a write of 1.3 MB that lands costs it about 0.4 s of CPU,
measured), and at the limit every admission pass of the ClusterQuota would send one. Past it
one is sent again, in case the limit was raised or the rest of the object shrank."""


def too_large(error: client.ApiException) -> bool:
    """Whether the API server refused a write for the object's size."""
    if error.status == 413:
        return True
    return error.status == 500 and any(text in _message(error) for text in TOO_LARGE_MESSAGES)


def _message(error: client.ApiException) -> str:
    body = error.body.decode(errors="replace") if isinstance(error.body, bytes) else error.body
    try:
        decoded = json.loads(body) if isinstance(body, str) else None
    except ValueError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
        return str(decoded["message"])
    return str(body or error.reason or "")


class KubeClusterQuotaWriter:
    """PUTs a ClusterQuota's status with the resourceVersion it carries."""

    def __init__(
        self,
        api: client.ApiClient,
        tracker: WriteTracker | None = None,
        controller_api: client.ApiClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``api``: admission's reads and writes; ``controller_api`` (default: ``api``): the
        usage controller's (:meth:`update_status`), apart for the reason
        :class:`~tally.kube.quota_accessor.KubeQuotaAccessor` gives."""
        self._api = api
        self._controller_api = controller_api or api
        self._recent = RecentWrites(RECENT_WRITES)
        # Copies read after a lost compare-and-swap: for admission only (see freshest).
        self._refreshed = RecentWrites(RECENT_WRITES)
        self.tracker = tracker
        self._clock = clock
        self._refused: dict[str, tuple[int, float]] = {}
        """By ClusterQuota name: the smallest status size refused, and when it was last
        refused (:data:`REFUSED_SIZE_MEMORY_S`)."""

    def newest(self, cached: Obj) -> Obj:
        """``cached``, or this process's later write of the same ClusterQuota."""
        return self._recent.check_cache(cached)

    def freshest(self, cached: Obj) -> Obj:
        """:meth:`newest`, or a later copy read from the API after a lost compare-and-swap.
        Admission's: the usage controller must not write over a copy its watch has not
        delivered yet (another replica's raise in it would not be held)."""
        return self._refreshed.check_cache(self._recent.check_cache(cached))

    async def put_status(self, cq: Obj, api: client.ApiClient | None = None) -> Obj:
        """The compare-and-swap write (through ``api``, by default admission's);
        :class:`Conflict` on 409; returns the stored object."""
        name = str((cq.get("metadata") or {}).get("name") or "")
        self._refuse_known_too_large(name, cq)
        path = rest.collection_path(GROUP, VERSION, PLURAL) + f"/{name}/status"
        key = cluster_quota_key("", name)
        if self.tracker is not None:
            self.tracker.writing(key)
        stored: Obj | None = None
        try:
            stored = await rest.put_json(api or self._api, path, cq)
        except client.ApiException as error:
            if error.status == 409:
                raise Conflict(f"clusterquotas/{name}: {error.reason}") from error
            if error.status == 404:
                raise NotFound(f"clusterquotas/{name}: {error.reason}") from error
            if too_large(error):
                size = encoded_size(cq.get("status"))
                known = self._refused.get(name)
                self._refused[name] = (min(size, known[0]) if known else size, self._clock())
                raise TooLarge(
                    f"clusterquotas/{name}: the API server refused its status of {size} bytes "
                    f"as too large ({_message(error)}); {SPLIT_HINT}"
                ) from error
            raise
        finally:
            if self.tracker is not None:
                self.tracker.wrote(key, stored)
        self._recent.add(stored)
        return dict(stored)

    def _refuse_known_too_large(self, name: str, cq: Obj) -> None:
        """Raise :class:`TooLarge` for a status at least as large as one the API server
        refused within :data:`REFUSED_SIZE_MEMORY_S`. Measured only then: encoding a status of
        10 000 namespaces costs 20-40 ms."""
        known = self._refused.get(name)
        if known is None:
            return
        limit, when = known
        ago = self._clock() - when
        if ago >= REFUSED_SIZE_MEMORY_S:
            del self._refused[name]
            return
        size = encoded_size(cq.get("status"))
        if size >= limit:
            raise TooLarge(
                f"clusterquotas/{name}: its status of {size} bytes was not sent: the API server "
                f"refused one of {limit} bytes as too large {ago:.0f} s ago; {SPLIT_HINT}"
            )

    async def refresh(self, name: str) -> None:
        """Read the ClusterQuota from the API (a quorum read, not the watch cache) and keep it
        as the newest copy: after a lost compare-and-swap the cache may still lag behind the
        write that won, and a retry judged against it would lose again."""
        path = rest.collection_path(GROUP, VERSION, PLURAL) + f"/{name}"
        self._refreshed.add(await rest.get_json(self._api, path))

    async def update_status(self, cq: Obj, status: Mapping[str, Any]) -> None:
        """The usage controller's write; a ClusterQuota deleted meanwhile is done."""
        try:
            await self.put_status({**cq, "status": dict(status)}, self._controller_api)
        except NotFound:
            return
