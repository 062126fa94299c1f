"""The Lease that tally's leader election reads and writes (client-go ``resourcelock.LeaseLock``).

Thin on purpose: :mod:`tally.machinery.leaderelection` decides; this module GETs, POSTs and PUTs one
``coordination.k8s.io/v1`` Lease as plain JSON. Every update carries the resourceVersion of
the Lease last read or written (kept in ``_lease``, as client-go keeps ``ll.lease``), so a
write over a Lease someone else changed meanwhile fails with 409 instead of overwriting it.

Requests time out after half the renew deadline (at least 1 s): client-go's advice in
``NewFromKubeconfig``, so that one hung request cannot use up a whole renewal round.
Errors come back as :class:`~tally.machinery.leaderelection.LockError` (409:
:class:`~tally.machinery.leaderelection.LockConflict`), whatever failed underneath.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client

from tally.kube import rest
from tally.machinery.leaderelection import (
    LeaderElectionRecord,
    LockConflict,
    LockError,
    lease_spec,
    record_from_lease_spec,
)

GROUP_VERSION: Final = "coordination.k8s.io/v1"


class KubeLeaseLock:
    """One Lease, ``namespace/name``, written as ``identity``."""

    def __init__(
        self, api: client.ApiClient, namespace: str, name: str, *, request_timeout: float
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self._timeout = max(1.0, request_timeout)
        self._collection = rest.collection_path("coordination.k8s.io", "v1", "leases", namespace)
        self._lease: dict[str, Any] | None = None
        """The Lease as last read or written; None until then (nothing to update over)."""

    def describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def has_version(self) -> bool:
        return self._lease is not None

    async def get(self) -> LeaderElectionRecord | None:
        try:
            lease = await self._call("GET", f"{self._collection}/{self.name}")
        except LockError as error:
            if error.status == 404:
                return None
            raise
        self._lease = lease
        return record_from_lease_spec(lease.get("spec"))

    async def create(self, record: LeaderElectionRecord) -> None:
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": lease_spec(record),
        }
        self._lease = await self._call("POST", self._collection, body)

    async def update(self, record: LeaderElectionRecord) -> None:
        if self._lease is None:
            raise LockError("lease not initialized, call get or create first")
        body = {**self._lease, "spec": lease_spec(record)}
        self._lease = await self._call("PUT", f"{self._collection}/{self.name}", body)

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        try:
            return await rest.request_json(
                self._api, method, path, body, request_timeout=self._timeout
            )
        except client.ApiException as error:
            status = int(error.status or 0)
            message = f"{method} {path}: HTTP {status} {_status_message(error)}"
            if status == 409:
                raise LockConflict(message, status=status) from error
            raise LockError(message, status=status) from error
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            raise LockError(f"{method} {path}: no answer: {error!r}") from error
        except TypeError as error:  # not a JSON object
            raise LockError(str(error)) from error


def _status_message(error: client.ApiException) -> str:
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = json.loads(error.body or "{}").get("message")
        if message:
            return str(message)
    return str(error.reason or "")
