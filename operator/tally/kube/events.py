"""Warning Events about an object, written straight through the core v1 events API.

For reports that happen once per change of state (a quota that names what cannot be counted; a
ClusterQuota whose usage stopped being computed): one POST each, no correlator. The PodSet
controller, whose Events come per pod and must be aggregated and counted as upstream's are,
goes through :class:`tally.machinery.broadcaster.EventBroadcaster` instead.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Mapping
from typing import Any, Final

from kubernetes_asyncio import client

from tally.kube import rest

MESSAGE_MAX: Final = 1024
"""An Event's message is cut to this many characters (the API server refuses longer ones)."""
NAMESPACE_DEFAULT: Final = "default"
"""Where Events about a cluster-scoped object live (client-go does the same)."""


class WarningRecorder:
    """Warning Events whose ``involvedObject`` is an object of one kind."""

    def __init__(
        self, api: client.ApiClient, *, kind: str, api_version: str, component: str
    ) -> None:
        self._api = api
        self._kind = kind
        self._api_version = api_version
        self._component = component
        self._instance = os.environ.get("POD_NAME") or socket.gethostname()

    def event_body(self, obj: Mapping[str, Any], reason: str, message: str) -> dict[str, Any]:
        """The Event :meth:`warn` creates for ``obj``."""
        metadata = obj.get("metadata") or {}
        own_namespace = str(metadata.get("namespace") or "")
        namespace = own_namespace or NAMESPACE_DEFAULT
        name = str(metadata.get("name") or "")
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved: dict[str, Any] = {
            "apiVersion": self._api_version,
            "kind": self._kind,
            "name": name,
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
        }
        if own_namespace:
            involved["namespace"] = own_namespace
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:MESSAGE_MAX],
            "type": "Warning",
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }

    async def warn(self, obj: Mapping[str, Any], reason: str, message: str) -> None:
        """Create a Warning Event about ``obj``; raises what the API client raises."""
        body = self.event_body(obj, reason, message)
        await self._api.call_api(
            rest.collection_path("", "v1", "events", body["metadata"]["namespace"]),
            "POST",
            body=body,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            auth_settings=["BearerToken"],
            _request_timeout=rest.REQUEST_TIMEOUT_S,
        )
