"""The plugin's conversation with the API server, as the user: their kubeconfig, their rights.

:class:`Session` logs in the way kubectl does (``--kubeconfig``, else ``KUBECONFIG``, else
``~/.kube/config``, with ``--context``; in a pod without any of them, the service account) and
never writes the kubeconfig back. Requests go through :mod:`tally.kube.rest` (plain JSON, paged
LISTs), the same client code tally's controllers use. Every failure leaves here as one
:class:`~tally.cli.errors.CliError` line: an unreachable server names the address, an RBAC 403
the verb and resource, a 404 what was missing. LISTs report their progress (stderr, a terminal
only), since a namespace or a cluster can hold tens of thousands of pods.

Discovery is asked only what a command needs: the preferred version of a group, or the
resource behind a kind, so the plugin follows whatever versions the cluster serves.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
from kubernetes_asyncio import client, config

from tally.cli.errors import CliError, Target, api_error_message, is_rbac_forbidden, status_message
from tally.cli.progress import Progress
from tally.cli.why import Decision, parse_denial
from tally.kube import rest

__all__ = ["Resource", "Session", "collection_path", "default_kubeconfig"]

IN_CLUSTER_NAMESPACE: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DRY_RUN_TIMEOUT_S: Final = 30.0


def default_kubeconfig(environ: Mapping[str, str]) -> str:
    """``KUBECONFIG`` (a list of paths, as kubectl reads it), else ``~/.kube/config``."""
    return environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def _any_file(paths: str) -> bool:
    """Whether one of the kubeconfig ``paths`` (``:``-separated) exists."""
    return any(Path(p).expanduser().is_file() for p in paths.split(os.pathsep) if p)


def collection_path(group: str, version: str, plural: str, namespace: str | None) -> str:
    return rest.collection_path(group, version, plural, namespace)


@dataclass(frozen=True)
class Resource:
    """A served resource: where to reach it and what it is called."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def label(self) -> str:
        """``pods``, ``podsets.tally.dev``: how RBAC and kubectl name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


class Session:
    """One API client for one command; :meth:`close` it."""

    def __init__(self, api: client.ApiClient, host: str, progress: Progress) -> None:
        self.api = api
        self.host = host
        self.progress = progress

    @classmethod
    async def open(
        cls, kubeconfig: str | None, context: str | None, progress: Progress
    ) -> tuple[Session, str]:
        """The session and the context's namespace (``default`` when it names none)."""
        configuration = client.Configuration()
        paths = kubeconfig or default_kubeconfig(os.environ)
        namespace = "default"
        if _any_file(paths):
            try:
                loader = await config.load_kube_config(
                    config_file=paths,
                    context=context,
                    client_configuration=configuration,
                    persist_config=False,
                )
            except (config.ConfigException, OSError, ValueError, KeyError, TypeError) as error:
                raise CliError(f"cannot use the kubeconfig {paths}: {error}") from None
            current = getattr(loader, "current_context", None) or {}
            namespace = (current.get("context") or {}).get("namespace") or "default"
        elif kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            try:
                # Untyped in kubernetes-asyncio (tally.kube.rest has the same call).
                config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            except config.ConfigException as error:
                raise CliError(f"no kubeconfig, and not usable in-cluster: {error}") from None
            if IN_CLUSTER_NAMESPACE.is_file():
                namespace = IN_CLUSTER_NAMESPACE.read_text().strip() or namespace
        else:
            raise CliError(
                f"no kubeconfig at {paths}: pass --kubeconfig, or set KUBECONFIG "
                "(the file kubectl uses)"
            )
        api = client.ApiClient(configuration)
        host = str(configuration.host)
        rest.read_environment_once(api, host)
        return cls(api, host, progress), namespace

    async def close(self) -> None:
        self.progress.clear()
        await self.api.close()

    def _failure(self, target: Target, error: BaseException) -> CliError:
        """One line for anything a request raised."""
        if isinstance(error, client.ApiException):
            status = int(error.status or 0)
            return CliError(
                api_error_message(target, status, str(error.reason), error.body),
                forbidden=is_rbac_forbidden(status, status_message(error.body)),
            )
        if isinstance(error, aiohttp.ClientConnectorCertificateError):
            return CliError(
                f"the API server at {self.host} presents a certificate your kubeconfig does "
                f"not trust: {error.certificate_error}"
            )
        if isinstance(error, aiohttp.ClientConnectorError):
            reason = error.os_error.strerror or str(error.os_error)
            return CliError(f"cannot reach the API server at {self.host}: {reason}")
        if isinstance(error, TimeoutError):
            return CliError(f"the API server at {self.host} did not answer in time ({target})")
        if isinstance(error, ssl.SSLError | aiohttp.ClientError):
            return CliError(f"talking to the API server at {self.host} failed: {error}")
        return CliError(f"{target}: {error}")

    async def get(self, path: str, target: Target) -> dict[str, Any] | None:
        """GET ``path``; None when it does not exist (404)."""
        try:
            return await rest.get_json(self.api, path)
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise self._failure(target, error) from None
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as error:
            raise self._failure(target, error) from None

    async def list_all(self, resource: Resource, namespace: str | None) -> list[dict[str, Any]]:
        """Every object of ``resource`` in ``namespace`` (all when None), page by page, with
        progress. An unserved resource (404) is empty."""
        target = Target("list", resource.label, namespace)
        where = f" in {namespace}" if namespace else ""
        items: list[dict[str, Any]] = []
        try:
            async for page in rest.list_pages(
                self.api, resource.group, resource.version, resource.plural, namespace=namespace
            ):
                items.extend(page)
                self.progress.update(f"listing {resource.label}{where}", len(items))
        except client.ApiException as error:
            if error.status == 404:
                return []
            raise self._failure(target, error) from None
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as error:
            raise self._failure(target, error) from None
        finally:
            self.progress.clear()
        return items

    async def preferred_version(self, group: str) -> str | None:
        """The version the cluster prefers for ``group`` (``v1`` for the core group); None
        when the group is not served."""
        if not group:
            return "v1"
        found = await self.get(f"/apis/{group}", Target("get", f"the API group {group}"))
        if found is None:
            return None
        preferred = found.get("preferredVersion") or {}
        version = preferred.get("version")
        return str(version) if version else None

    async def resources(self, group: str, version: str) -> list[dict[str, Any]]:
        """The resources of ``group/version`` (discovery); empty when it is not served."""
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        found = await self.get(path, Target("get", f"the API {group or 'core'}/{version}"))
        return list((found or {}).get("resources") or [])

    async def resource(self, group: str, plural: str) -> Resource | None:
        """``group``'s ``plural`` at its preferred version; None when not served."""
        version = await self.preferred_version(group)
        if version is None:
            return None
        for entry in await self.resources(group, version):
            if entry.get("name") == plural:
                return Resource(
                    group, version, plural, str(entry.get("kind")), bool(entry.get("namespaced"))
                )
        return None

    async def resource_for_kind(self, api_version: str, kind: str) -> Resource | None:
        """The resource an object of ``kind`` in ``api_version`` is created as."""
        group, _, version = api_version.rpartition("/")
        for entry in await self.resources(group, version):
            name = str(entry.get("name") or "")
            if entry.get("kind") == kind and "/" not in name:
                return Resource(group, version, name, kind, bool(entry.get("namespaced")))
        return None

    async def dry_run_create(
        self, resource: Resource, namespace: str, obj: dict[str, Any]
    ) -> Decision:
        """What the API server decides about creating ``obj`` (``?dryRun=All``: every
        admission step runs, nothing is stored or charged). An object of that name that exists
        already is tried under a generated name instead: quota does not care about names."""
        path = collection_path(resource.group, resource.version, resource.plural, namespace)
        target = Target("create", resource.label, namespace)
        body = dict(obj)
        for attempt in range(2):
            try:
                await rest.request_json(
                    self.api,
                    "POST",
                    path,
                    body,
                    query=[("dryRun", "All")],
                    request_timeout=DRY_RUN_TIMEOUT_S,
                )
            except client.ApiException as error:
                message = status_message(error.body)
                if error.status == 409 and attempt == 0:
                    metadata = dict(body.get("metadata") or {})
                    metadata["generateName"] = f"{metadata.pop('name', 'why')}-"
                    body = {**body, "metadata": metadata}
                    continue
                if error.status == 403 and not is_rbac_forbidden(403, message):
                    return Decision(False, parse_denial(message))
                raise self._failure(target, error) from None
            except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as error:
                raise self._failure(target, error) from None
            return Decision(True)
        raise CliError(f"{target}: the dry run conflicted twice")  # pragma: no cover
