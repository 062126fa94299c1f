"""AppliedClusterQuota writes: create, replace (compare-and-swap on the resourceVersion read)
and delete (with the uid read as precondition) of ``appliedclusterquotas.tally.dev`` objects,
for the controller that keeps them (``tally.clusterquota.applied``, which names the resource:
this layer sits below it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from tally.kube import rest
from tally.machinery.errors import Conflict, NotFound

Obj = Mapping[str, Any]


class KubeAppliedQuotaWriter:
    def __init__(self, api: client.ApiClient, group: str, version: str, plural: str) -> None:
        self._api = api
        self._resource = (group, version, plural)

    def _path(self, obj: Obj, *, named: bool) -> str:
        metadata = obj.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "")
        path = rest.collection_path(*self._resource, namespace)
        return f"{path}/{metadata.get('name')}" if named else path

    async def create(self, body: Obj) -> None:
        try:
            await rest.post_json(self._api, self._path(body, named=False), body)
        except client.ApiException as error:
            if error.status == 409:
                raise Conflict(f"{self._path(body, named=True)}: exists already") from error
            if error.status == 404 or (
                error.status == 403 and "being terminated" in str(error.body)
            ):
                return  # its namespace went meanwhile, or is being deleted
            raise

    async def replace(self, existing: Obj, body: Obj) -> None:
        metadata = {
            **(body.get("metadata") or {}),
            "resourceVersion": str((existing.get("metadata") or {}).get("resourceVersion") or ""),
        }
        labels = {**((existing.get("metadata") or {}).get("labels") or {}), **metadata["labels"]}
        try:
            await rest.put_json(
                self._api,
                self._path(body, named=True),
                {**body, "metadata": {**metadata, "labels": labels}},
            )
        except client.ApiException as error:
            if error.status == 409:
                raise Conflict(f"{self._path(body, named=True)}: {error.reason}") from error
            if error.status == 404:
                raise NotFound(f"{self._path(body, named=True)}: {error.reason}") from error
            raise

    async def delete(self, existing: Obj) -> None:
        uid = str((existing.get("metadata") or {}).get("uid") or "")
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                **({"preconditions": {"uid": uid}} if uid else {})}  # fmt: skip
        try:
            await rest.request_json(self._api, "DELETE", self._path(existing, named=True), body)
        except client.ApiException as error:
            if error.status in (404, 409):
                return  # gone, or another object by that name now (the next sync decides)
            raise
