"""The webhook server's TLS: where its certificate comes from, how it is renewed while tally
runs, and how the running server and the webhook configuration's caBundle follow.

Where the material lives, one :class:`Source` per way of running tally:

* :class:`MemorySource` (nothing configured; local development): a new CA and serving pair at
  every start, renewed in memory while tally runs.
* :class:`SecretSource` (``TALLY_WEBHOOK_CERT_SECRET``): a ``kubernetes.io/tls`` Secret, so that
  a restarted tally serves the same certificate and the caBundle stays as it was. Created when
  missing, replaced with the resourceVersion read; a 409 means someone else wrote it meanwhile:
  read it again and decide again. tally owns the Secret's data (it replaces all of it).
* :class:`MountedSource` (``TALLY_WEBHOOK_CERT_MOUNT``): files someone else renews (a mounted
  cert-manager Secret, which the kubelet updates in place); served as found, never written.

:class:`ServingTLS` runs one *pass* at start-up, which must succeed (nothing is served without a
certificate), and again whenever something falls due (:func:`tally.webhook.certs.next_check`), every
check period, and when the Secret's watch event shows someone else changed it. A pass reads,
decides (:func:`tally.webhook.certs.plan`; :func:`tally.webhook.certs.problems` for files tally may
not change), writes, and makes the server and the caBundle follow. A pass that fails changes
nothing that is served and is retried with backoff; the current certificate has a third of its
validity left when renewal starts, so there is time.

**The running server follows without a restart.** The webhook server's ``ssl.SSLContext`` is
tally's: a new pair is loaded into that same context (``load_cert_chain``), and every handshake
after that presents it, while open connections keep theirs. Kopf's own mechanism restarts the
whole server when its files change, which closes the port for a moment; with ``failurePolicy:
Fail`` the API server refuses requests meanwhile. Loading happens in the event loop, between
two handshakes (which also run in the loop), so no handshake sees half a pair.

**Order of a switch.** The API server must trust a serving certificate before tally presents it,
and keep trusting the previous one while connections made earlier are reused. So when the
serving certificate changes: publish the union of the old and the new bundle; if the new
certificate's CA was not in the published bundle, pause a moment for the API servers to see it
(that happens only when the old certificate was unusable or someone else replaced the material:
tally's own CA rotation waits out ``ca_overlap`` first, see :mod:`tally.webhook.certs`); load the
new pair; publish the new bundle.

**Mutual TLS** (``TALLY_WEBHOOK_CLIENT_CA``): the context requires a client certificate signed
by that CA and by nothing else. It is built from a bare ``SSLContext``, not
``ssl.create_default_context``, which also loads the system's CAs: with client certificates
required, that would admit a certificate from any public CA.

Several replicas (leader election) share one Secret: every replica runs the passes, a write
that loses the compare-and-swap (409) reads again and serves what the winner wrote, and the
Secret's watch event brings each replica the others' renewals. Publishing the caBundle writes
the webhook configuration only on the leader, whose registrar registered it
(:meth:`tally.webhook.registrar.WebhookRegistrar.set_ca_bundle`); a follower keeps the bundle for
the day it leads. A CA rotation publishes the new CA an overlap before any replica presents a
certificate it signed, so followers do not depend on the leader's timing. The exception is a
Secret someone replaced with material of another CA: every replica reacts to the same watch
event, and a follower may present the new certificate a moment before the leader's pass has
published its CA.

Left out: reloading the client CA file (a change needs a restart).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Protocol

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kubernetes_asyncio import client

from tally.kube import rest
from tally.machinery.errors import Conflict
from tally.webhook import certs
from tally.webhook.certs import Material, MaterialError, Policy
from tally.workqueue import start_watched
from tally.workqueue.tasks import cancel_and_wait

logger = logging.getLogger(__name__)

MAX_CONFLICTS: Final = 5
"""Writes lost to someone else's in one pass before the pass gives up (and is retried)."""
RETRY_S: Final = 5.0
"""First wait after a failed pass; doubled per failure, capped at the check period."""
MIN_WAIT_S: Final = 0.5
"""Shortest wait between passes, so that a decision that is due again at once cannot spin."""
SWITCH_PAUSE_S: Final = 2.0
"""Pause between publishing a CA the API servers did not trust and presenting a certificate it
signed. API servers pick configuration changes up well within it (their informer)."""
SECRET_TYPE: Final = "kubernetes.io/tls"

Publish = Callable[[bytes], Awaitable[None]]
"""Hands a caBundle (PEM) to the webhook configuration."""


@dataclass(frozen=True)
class Stored:
    """What a source holds, as read."""

    data: Mapping[str, bytes] | None
    """The Secret data keys (``tls.crt`` …), decoded; None: nothing there."""
    version: str = ""
    """resourceVersion (or a digest): what a write must name, and what a watch event shows."""
    raw: Mapping[str, Any] | None = None
    """The object read (a Secret), replaced by a write; None: none exists."""


class Source(Protocol):
    """Where the serving material lives."""

    writable: bool
    """Whether tally may renew the material (False: it only serves what it finds)."""

    def describe(self) -> str: ...

    async def read(self) -> Stored: ...

    async def write(self, data: Mapping[str, bytes], stored: Stored) -> str:
        """Replace ``stored`` with ``data``; the new version. :class:`Conflict` if ``stored``
        is no longer what is there."""
        ...


class MemorySource:
    """Nothing kept across restarts: a fresh CA and pair at every start."""

    writable = True

    def __init__(self) -> None:
        self._data: dict[str, bytes] | None = None
        self._version = 0

    def describe(self) -> str:
        return "memory"

    async def read(self) -> Stored:
        return Stored(dict(self._data) if self._data else None, str(self._version))

    async def write(self, data: Mapping[str, bytes], stored: Stored) -> str:
        if stored.version != str(self._version):
            raise Conflict("memory")
        self._data = dict(data)
        self._version += 1
        return str(self._version)


class SecretSource:
    """A ``kubernetes.io/tls`` Secret tally creates and renews (``TALLY_WEBHOOK_CERT_SECRET``)."""

    writable = True

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name

    @property
    def path(self) -> str:
        return f"{rest.collection_path('', 'v1', 'secrets', self.namespace)}/{self.name}"

    def describe(self) -> str:
        return f"Secret {self.namespace}/{self.name}"

    async def read(self) -> Stored:
        try:
            obj = await rest.get_json(self._api, self.path)
        except client.ApiException as error:
            if error.status == 404:
                return Stored(None)
            raise
        try:
            data = {key: base64.b64decode(value) for key, value in (obj.get("data") or {}).items()}
        except ValueError:
            data = {}  # not base64: unreadable, replaced like any unreadable content
        return Stored(data or None, str(obj["metadata"]["resourceVersion"]), obj)

    async def write(self, data: Mapping[str, bytes], stored: Stored) -> str:
        encoded = {key: base64.b64encode(value).decode("ascii") for key, value in data.items()}
        try:
            if stored.raw is None:
                written = await rest.post_json(
                    self._api,
                    rest.collection_path("", "v1", "secrets", self.namespace),
                    {
                        "apiVersion": "v1",
                        "kind": "Secret",
                        "metadata": {
                            "name": self.name,
                            "namespace": self.namespace,
                            "labels": {"app.kubernetes.io/managed-by": "tally"},
                        },
                        "type": SECRET_TYPE,
                        "data": encoded,
                    },
                )
            else:
                # The object as read (labels, annotations, type, and the resourceVersion that
                # makes this a compare-and-swap), with tally's data.
                written = await rest.put_json(self._api, self.path, {**stored.raw, "data": encoded})
        except client.ApiException as error:
            if error.status == 409:
                raise Conflict(self.describe()) from None
            raise
        return str(written["metadata"]["resourceVersion"])


class MountedSource:
    """``tls.crt``, ``tls.key`` and ``ca.crt`` in a directory someone else keeps current
    (``TALLY_WEBHOOK_CERT_MOUNT``). Reading three small files from a tmpfs mount takes
    microseconds, so it happens in the event loop."""

    writable = False

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def describe(self) -> str:
        return f"files in {self.directory}"

    async def read(self) -> Stored:
        data: dict[str, bytes] = {}
        for name in (certs.CA_CRT, certs.TLS_CRT, certs.TLS_KEY):
            with contextlib.suppress(FileNotFoundError):
                data[name] = (self.directory / name).read_bytes()
        if not data:
            return Stored(None)
        digest = hashlib.sha256(b"\0".join(data.get(k, b"") for k in sorted(data))).hexdigest()
        return Stored(data, digest)

    async def write(self, data: Mapping[str, bytes], stored: Stored) -> str:
        raise TypeError(f"{self.describe()} are read-only for tally")


def server_context(client_ca: str = "") -> ssl.SSLContext:
    """The webhook server's context, with no certificate loaded yet. With ``client_ca``, a
    client certificate signed by it is required (and no other CA is trusted)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if client_ca:
        try:
            context.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as error:
            raise ValueError(f"TALLY_WEBHOOK_CLIENT_CA={client_ca!r}: {error}") from error
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class ServingTLS:
    """The webhook server's certificate, from :meth:`load` on; kept current after :meth:`start`.

    ``material`` is what the server presents; ``context`` is the server's ``SSLContext`` (hand
    it to the server once, it is reloaded in place). ``on_load`` is called with the notAfter of
    each certificate loaded into the context.
    """

    def __init__(
        self,
        source: Source,
        *,
        hosts: Sequence[str],
        policy: Policy,
        directory: Path,
        client_ca: str = "",
        check_period: float = 60.0,
        clock: Callable[[], datetime.datetime] = _utc_now,
        on_load: Callable[[datetime.datetime], None] | None = None,
    ) -> None:
        self.source = source
        self.hosts = tuple(dict.fromkeys(hosts))
        self.policy = policy
        self.directory = directory
        self.check_period = check_period
        self._clock = clock
        self._on_load = on_load
        """Told the notAfter of every certificate loaded into ``context`` (the expiry gauge:
        what the server presents, not what is stored, which may not have been loaded)."""
        self.context = server_context(client_ca)
        self.material: Material | None = None
        """What the server presents (loaded into ``context``); None before :meth:`load`."""
        self._published = b""
        """The caBundle last handed to ``publish`` (what the API servers trust, or soon will)."""
        self._publish: Publish | None = None
        self._version = ""
        """The source's version tally last read or wrote: a watch event with another one is
        someone else's write."""
        self._noted: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def ca_bundle(self) -> bytes:
        """The caBundle for the webhook configuration (PEM)."""
        return self.material.ca_bundle if self.material is not None else b""

    async def load(self) -> None:
        """The first pass: read, make what is missing, load the server's context. Raises when
        no usable certificate can be had (a read-only source with an unusable one, the API
        refusing the Secret)."""
        await self.check()

    async def check(self) -> datetime.datetime:
        """One pass now: read, decide, write, follow. Returns when the next one is due."""
        return await self._pass()

    def start(self, publish: Publish) -> None:
        """Keep the certificate current: a pass when something is due, every check period, and
        after :meth:`changed`. ``publish`` hands a new caBundle to the webhook configuration
        (it has the current one already)."""
        self._publish = publish
        self._published = self.ca_bundle
        self._task = start_watched(self._run(), name="webhook-tls", logger=logger)

    def secret_event(self, obj: Mapping[str, Any]) -> None:
        """A Secret's watch event: if it is the Secret this keeper reads, someone may have
        changed the material (:meth:`changed`; events of its own writes are ignored there)."""
        source = self.source
        metadata = obj.get("metadata") or {}
        if isinstance(source, SecretSource) and (
            metadata.get("namespace"),
            metadata.get("name"),
        ) == (source.namespace, source.name):
            self.changed(str(metadata.get("resourceVersion") or ""))

    def changed(self, version: str) -> None:
        """The stored material was written (a watch event with this version): a pass soon,
        unless tally wrote or read exactly that version itself."""
        if version != self._version:
            self._wake.set()

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            await cancel_and_wait(self._task)

    # -- passes

    async def _run(self) -> None:
        failures = 0
        while True:
            # Cleared before the pass: a change announced during it is another pass.
            self._wake.clear()
            try:
                due = await self.check()
            except Exception as error:  # whatever it was: served as before, retried
                failures += 1
                wait = min(self.check_period, RETRY_S * 2 ** min(failures - 1, 6))
                logger.error(
                    "webhook certificate (%s): %s; the server keeps its certificate; "
                    "next try in %.0f s",
                    self.source.describe(),
                    error,
                    wait,
                )
            else:
                failures = 0
                ahead = (due - self._clock()).total_seconds()
                wait = min(self.check_period, max(MIN_WAIT_S, ahead))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def _pass(self) -> datetime.datetime:
        """Read, decide, write, follow; when to look again."""
        for _ in range(MAX_CONFLICTS):
            stored = await self.source.read()
            now = self._clock()
            found = self._parse(stored)
            if self.source.writable:
                # Nothing readable stored: start from what is served (no switch for the API
                # servers), or from nothing at start-up.
                decided = certs.plan(found or self.material, self.hosts, now, self.policy)
                if found is None or decided.changes:
                    try:
                        self._version = await self.source.write(
                            decided.material.secret_data(), stored
                        )
                    except Conflict:
                        logger.info(
                            "webhook certificate: %s was written by someone else; reading it again",
                            self.source.describe(),
                        )
                        continue
                    logger.info(
                        "webhook certificate written to %s: %s",
                        self.source.describe(),
                        "; ".join(decided.changes) or "what is served",
                    )
                else:
                    self._version = stored.version
                if decided.waiting:
                    self._note(logging.INFO, decided.waiting)
                material = decided.material
            else:
                if found is None:
                    raise MaterialError(f"{self.source.describe()}: no usable certificate")
                unusable, warnings = certs.problems(found, self.hosts, now, self.policy)
                if unusable:
                    raise MaterialError(f"{self.source.describe()}: {unusable}")
                for warning in warnings:
                    self._note(logging.WARNING, f"{self.source.describe()}: {warning}")
                self._version = stored.version
                material = found
            await self._serve(material)
            return certs.next_check(material, now, self.policy)
        raise Conflict(
            f"{self.source.describe()} was written by someone else {MAX_CONFLICTS} times in a row"
        )

    def _parse(self, stored: Stored) -> Material | None:
        if stored.data is None:
            if self.material is not None:
                logger.warning(
                    "webhook certificate: %s is gone; writing the certificate served",
                    self.source.describe(),
                )
            return None
        try:
            return certs.from_secret_data(stored.data)
        except MaterialError as error:
            if self.source.writable:
                logger.warning(
                    "webhook certificate: %s cannot be used (%s); replacing it",
                    self.source.describe(),
                    error,
                )
                return None
            raise MaterialError(f"{self.source.describe()}: {error}") from None

    def _note(self, level: int, message: str) -> None:
        """Log ``message`` once (until the served certificate changes)."""
        if message not in self._noted:
            self._noted.add(message)
            logger.log(level, "webhook certificate: %s", message)

    # -- following

    async def _serve(self, material: Material) -> None:
        previous = self.material
        if previous is None or previous.cert != material.cert:
            if previous is not None and self._publish is not None:
                trusted = _certificates(self._published)
                transition = _bundle([*material.cas, *trusted])
                if transition != self._published:
                    await self._publish(transition)
                    self._published = transition
                issuer = material.issuer()
                if issuer is None or issuer not in trusted:
                    await asyncio.sleep(SWITCH_PAUSE_S)
            self._load(material)
            self._noted.clear()
            issuer = material.issuer()
            logger.info(
                "webhook server presents a new certificate (serial %x, valid until %s, "
                "signed by %s; caBundle of %d CA(s))",
                material.cert.serial_number,
                material.cert.not_valid_after_utc.isoformat(),
                issuer.subject.rfc4514_string() if issuer is not None else "an unknown CA",
                len(material.cas),
            )
        self.material = material
        if self._publish is not None and material.ca_bundle != self._published:
            await self._publish(material.ca_bundle)
            self._published = material.ca_bundle

    def _load(self, material: Material) -> None:
        """Write the pair (and bundle, for people with curl) and load it into the context.
        Small files on a tmpfs/emptyDir: microseconds in the event loop."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        _write(self.directory / certs.TLS_KEY, material.key_pem, 0o600)
        _write(self.directory / certs.TLS_CRT, material.cert_pem, 0o644)
        _write(self.directory / certs.CA_CRT, material.ca_bundle, 0o644)
        self.context.load_cert_chain(self.directory / certs.TLS_CRT, self.directory / certs.TLS_KEY)
        self.material = material
        if self._on_load is not None:
            self._on_load(material.cert.not_valid_after_utc)


def _certificates(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem) if pem.strip() else []


def _bundle(cas: Sequence[x509.Certificate]) -> bytes:
    """PEM of ``cas`` in order, each once."""
    unique = list(dict.fromkeys(cas))
    return b"".join(ca.public_bytes(serialization.Encoding.PEM) for ca in unique)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` atomically: a reader sees the old file or the new one, whole."""
    partial = path.with_name(f".{path.name}.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as sink:
        sink.write(data)
    os.replace(partial, path)
