"""The other way to give tenants their view of a ClusterQuota, built to be measured: an
extension API server that serves AppliedClusterQuotas through kube-apiserver's aggregation
layer (as OpenShift serves AppliedClusterResourceQuota and metrics-server serves metrics),
where tally writes objects instead (:mod:`tally.clusterquota.applied`). Not shipped: why is in
``docs/clusterquota.md``; ``bench/applied.py`` runs this beside the objects to put numbers on
both. ``kopf run`` loads this file.

It does what an extension API server must, and no more than the measurement needs:

* **Authentication**: only kube-apiserver's front proxy may call it: a client certificate
  signed by the request-header CA whose common name is among the allowed names, both read
  from ``kube-system/extension-apiserver-authentication`` (where kube-apiserver publishes
  them); the caller is then the user the proxy names in its user, group and extra headers.
* **Authorization**: a SubjectAccessReview for every request, the decisions kept 10 s (the
  generic API server's delegating authorizer keeps them as long), so the built-in ``view``
  role given by ``tally-namespace-view`` reads a namespace's view and nothing else does.
* **The API**: ``view.tally.dev/v1alpha1`` ``appliedclusterquotas``, namespaced, ``get``,
  ``list`` and ``watch``, in one namespace or all. The object in namespace N is the one tally
  would write there (:func:`tally.clusterquota.applied.applied_object`), computed from the
  ClusterQuota's latest status (a Kopf watch of ClusterQuotas and of namespaces, for the
  selection) when a reader asks: no API write at all. A watch sends each object's change at
  most once per ``TALLY_VIEW_MIN_INTERVAL`` seconds (1), the latest state, as tally bounds its
  writes of one object; a version is computed once and shared by every reader.
* **Rights**: what any extension API server needs besides tally's own (``bench/applied.py``
  binds them, as a chart would ship them): ``extension-apiserver-authentication-reader`` in
  kube-system and ``system:auth-delegator`` (SubjectAccessReviews). Its registration (the
  APIService, its Service, the ClusterRole aggregating reads of it into ``view``) is the
  deployer's, made there too.

Left out because no measurement needs them: server-side table printing, field and label
selectors, resourceVersion semantics beyond "send the current state, then changes", and
OpenAPI (so ``kubectl explain`` knows nothing of the kind).

Environment: ``TALLY_VIEW_PORT`` (the HTTPS port on 127.0.0.1), ``TALLY_VIEW_TLS_DIR``
(``tls.crt``, ``tls.key``: a serving pair for the APIService's Service name),
``TALLY_VIEW_MIN_INTERVAL``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import kopf
from aiohttp import web
from kubernetes_asyncio import client, config

from tally.app.kopf_settings import configure_kopf
from tally.clusterquota import quota as cluster
from tally.clusterquota.applied import applied_object
from tally.kube import rest
from tally.machinery.selectors import LabelSelector

logger = logging.getLogger("tally.bench.view")

GROUP: Final = "view.tally.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "appliedclusterquotas"
KIND: Final = "AppliedClusterQuota"
AUTHORIZATION_TTL_S: Final = 10.0
DEFAULT_WATCH_TIMEOUT_S: Final = 1800

Obj = Mapping[str, Any]


class View:
    """The ClusterQuotas and namespaces as last seen, and the objects made from them: each
    (ClusterQuota version, namespace) computed once, whoever asks."""

    def __init__(self) -> None:
        self.quotas: dict[str, tuple[Obj, Mapping[str, Any], LabelSelector | None]] = {}
        self.namespaces: dict[str, Mapping[str, str]] = {}
        self.watchers: set[asyncio.Event] = set()
        self._made: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}

    def set_quota(self, name: str, cq: Obj | None) -> None:
        if cq is None:
            self.quotas.pop(name, None)
        else:
            try:
                chosen: LabelSelector | None = cluster.selector(cq)
            except cluster.InvalidClusterQuota:
                chosen = None
            self.quotas[name] = (cq, cluster.namespace_index(cq), chosen)
        self._changed()

    def set_namespace(self, name: str, labels: Mapping[str, str] | None) -> None:
        if labels is None:
            self.namespaces.pop(name, None)
        else:
            self.namespaces[name] = dict(labels)
        self._changed()

    def _changed(self) -> None:
        for event in self.watchers:
            event.set()

    def objects(self, namespace: str | None) -> dict[tuple[str, str], dict[str, Any]]:
        """Every object in ``namespace`` (None: in all), by (namespace, name)."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        namespaces = (
            list(self.namespaces) if namespace is None
            else [namespace] if namespace in self.namespaces else []
        )  # fmt: skip
        for name, (cq, index, chosen) in self.quotas.items():
            if chosen is None:
                continue
            version = str((cq.get("metadata") or {}).get("resourceVersion") or "")
            for ns in namespaces:
                if not chosen.matches(self.namespaces[ns]):
                    continue
                made = self._made.get((ns, name))
                if made is None or made[0] != version:
                    made = (version, self._make(cq, ns, index, version))
                    self._made[(ns, name)] = made
                found[(ns, name)] = made[1]
        return found

    @staticmethod
    def _make(cq: Obj, namespace: str, index: Mapping[str, Any], version: str) -> dict[str, Any]:
        obj = applied_object(cq, namespace, index)
        cq_meta = cq.get("metadata") or {}
        obj["apiVersion"] = f"{GROUP}/{VERSION}"
        obj["metadata"].update({
            "resourceVersion": version,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{cq_meta.get('uid')}/{namespace}")),
            "creationTimestamp": cq_meta.get("creationTimestamp"),
        })  # fmt: skip
        return obj


VIEW = View()


# -- Kopf: the watches


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    port = int(os.environ["TALLY_VIEW_PORT"])
    interval = float(os.environ.get("TALLY_VIEW_MIN_INTERVAL", "1.0"))
    await config.load_kube_config()
    api = client.ApiClient()
    memo["api"] = api
    configure_kopf(settings, initial_streaming=await rest.serves_watch_list(api))
    core = client.CoreV1Api(api)
    authn = (await core.read_namespaced_config_map(
        "extension-apiserver-authentication", "kube-system")).data  # fmt: skip
    serving_ssl = _tls(authn)
    server = Server(api, json.loads(authn["requestheader-allowed-names"]),
                    _header(authn, "requestheader-username-headers"),
                    _header(authn, "requestheader-group-headers"),
                    _header(authn, "requestheader-extra-headers-prefix"), interval)  # fmt: skip
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=serving_ssl).start()
    memo["runner"] = runner
    logger.info("serving %s/%s on 127.0.0.1:%d", GROUP, VERSION, port)


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    runner = memo.get("runner")
    if runner is not None:
        await runner.cleanup()
    api = memo.get("api")
    if api is not None:
        await api.close()


@kopf.on.event("tally.dev", "v1alpha1", "clusterquotas", id="view-clusterquotas")
async def on_cluster_quota(event: kopf.RawEvent, **_: Any) -> None:
    obj = event["object"]
    name = str((obj.get("metadata") or {}).get("name") or "")
    VIEW.set_quota(name, None if event["type"] == "DELETED" else obj)


@kopf.on.event("v1", "namespaces", id="view-namespaces")
async def on_namespace(event: kopf.RawEvent, **_: Any) -> None:
    metadata = event["object"].get("metadata") or {}
    labels = None if event["type"] == "DELETED" else (metadata.get("labels") or {})
    VIEW.set_namespace(str(metadata.get("name") or ""), labels)


# -- serving


def _header(authn: Mapping[str, str], key: str) -> str:
    names = json.loads(authn.get(key) or "[]")
    if not names:
        raise RuntimeError(f"extension-apiserver-authentication has no {key}")
    return str(names[0])


def _tls(authn: Mapping[str, str]) -> ssl.SSLContext:
    """The serving pair from ``TALLY_VIEW_TLS_DIR``, and a context that requires a client
    certificate signed by the request-header CA."""
    directory = Path(os.environ["TALLY_VIEW_TLS_DIR"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    context.load_verify_locations(cadata=authn["requestheader-client-ca-file"])
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip
    return web.json_response(body, status=code)


class Server:
    def __init__(
        self, api: client.ApiClient, allowed_names: list[str], user_header: str,
        group_header: str, extra_prefix: str, interval: float,
    ) -> None:  # fmt: skip
        self.authorization = client.AuthorizationV1Api(api)
        self.allowed_names = set(allowed_names)
        self.user_header, self.group_header = user_header, group_header
        self.extra_prefix = extra_prefix.lower()
        self.interval = interval
        self._decisions: dict[tuple[Any, ...], tuple[bool, float]] = {}

    def app(self) -> web.Application:
        app = web.Application()
        base = f"/apis/{GROUP}/{VERSION}"
        app.router.add_get(base, self.discovery)
        app.router.add_get(f"{base}/{PLURAL}", self.collection)
        app.router.add_get(f"{base}/namespaces/{{namespace}}/{PLURAL}", self.collection)
        app.router.add_get(f"{base}/namespaces/{{namespace}}/{PLURAL}/{{name}}", self.item)
        return app

    def _proxy_user(self, request: web.Request) -> tuple[str, list[str], dict[str, list[str]]]:
        """The user the front proxy names; raises 401 for any other caller."""
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        names = {value for rdn in (peer or {}).get("subject", ()) for key, value in rdn
                 if key == "commonName"}  # fmt: skip
        if not names & self.allowed_names:
            raise web.HTTPUnauthorized(text="only the front proxy may call this server")
        user = request.headers.get(self.user_header, "")
        if not user:
            raise web.HTTPUnauthorized(text="no user named")
        extra: dict[str, list[str]] = {}
        for key, value in request.headers.items():
            if key.lower().startswith(self.extra_prefix):
                extra.setdefault(key[len(self.extra_prefix) :].lower(), []).append(value)
        return user, request.headers.getall(self.group_header, []), extra

    async def _allowed(self, request: web.Request, verb: str, namespace: str, name: str) -> bool:
        user, groups, extra = self._proxy_user(request)
        key = (user, tuple(groups), tuple(sorted((k, tuple(v)) for k, v in extra.items())),
               verb, namespace, name)  # fmt: skip
        kept = self._decisions.get(key)
        now = time.monotonic()
        if kept is not None and kept[1] > now:
            return kept[0]
        review = {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "extra": extra,
                     "resourceAttributes": {"namespace": namespace, "verb": verb,
                                            "group": GROUP, "version": VERSION,
                                            "resource": PLURAL, "name": name}},
        }  # fmt: skip
        answer = await self.authorization.create_subject_access_review(review)
        allowed = bool(answer.status and answer.status.allowed)
        self._decisions[key] = (allowed, now + AUTHORIZATION_TTL_S)
        return allowed

    async def discovery(self, request: web.Request) -> web.Response:
        self._proxy_user(request)
        return web.json_response({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}",
            "resources": [{"name": PLURAL, "singularName": "appliedclusterquota",
                           "namespaced": True, "kind": KIND, "verbs": ["get", "list", "watch"],
                           "shortNames": ["acqv"]}],
        })  # fmt: skip

    async def collection(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info.get("namespace")
        watching = request.query.get("watch", "").lower() in ("1", "true")
        verb = "watch" if watching else "list"
        if not await self._allowed(request, verb, namespace or "", ""):
            where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
            user = request.headers.get(self.user_header, "")
            return _status(403, "Forbidden",
                           f'{PLURAL}.{GROUP} is forbidden: User "{user}" cannot {verb} '
                           f'resource "{PLURAL}" in API group "{GROUP}"{where}')  # fmt: skip
        if watching:
            return await self.watch(request, namespace)
        items = list(VIEW.objects(namespace).values())
        version = max((int(o["metadata"]["resourceVersion"] or 0) for o in items), default=0)
        return web.json_response({
            "apiVersion": f"{GROUP}/{VERSION}", "kind": f"{KIND}List",
            "metadata": {"resourceVersion": str(version)}, "items": items,
        })  # fmt: skip

    async def item(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not await self._allowed(request, "get", namespace, name):
            user = request.headers.get(self.user_header, "")
            return _status(403, "Forbidden",
                           f'{PLURAL}.{GROUP} "{name}" is forbidden: User "{user}" cannot get '
                           f'resource "{PLURAL}" in API group "{GROUP}" in the namespace '
                           f'"{namespace}"')  # fmt: skip
        found = VIEW.objects(namespace).get((namespace, name))
        if found is None:
            return _status(404, "NotFound", f'{PLURAL}.{GROUP} "{name}" not found')
        return web.json_response(found)

    async def watch(self, request: web.Request, namespace: str | None) -> web.StreamResponse:
        """The current state as ADDED (unless the reader gives a resourceVersion: it has it),
        then each object's changes at most once per interval, until ``timeoutSeconds``."""
        timeout = float(request.query.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S)
        deadline = time.monotonic() + timeout
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        changed = asyncio.Event()
        VIEW.watchers.add(changed)
        sent: dict[tuple[str, str], dict[str, Any]] = {}
        try:
            current = VIEW.objects(namespace)
            if request.query.get("resourceVersion") in (None, "", "0"):
                await self._send(response, [("ADDED", obj) for obj in current.values()])
            sent = dict(current)
            flushed = time.monotonic()
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(changed.wait(), remaining)
                except TimeoutError:
                    break
                await asyncio.sleep(max(0.0, flushed + self.interval - time.monotonic()))
                changed.clear()
                current = VIEW.objects(namespace)
                events: list[tuple[str, dict[str, Any]]] = []
                for key, obj in current.items():
                    before = sent.get(key)
                    if before is None:
                        events.append(("ADDED", obj))
                    elif before is not obj and (before["status"] != obj["status"]
                                                or before["spec"] != obj["spec"]):  # fmt: skip
                        events.append(("MODIFIED", obj))
                events.extend(("DELETED", obj) for key, obj in sent.items() if key not in current)
                sent = current
                flushed = time.monotonic()
                await self._send(response, events)
        except ConnectionResetError:
            pass  # the reader went
        finally:
            VIEW.watchers.discard(changed)
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, events: list[tuple[str, dict[str, Any]]]) -> None:
        if events:
            lines = "".join(json.dumps({"type": kind, "object": obj}, separators=(",", ":"))
                            + "\n" for kind, obj in events)  # fmt: skip
            await response.write(lines.encode())
