"""Requests to the API server exactly as written: bytes in, status code and message out.

kubernetes-asyncio serializes every JSON body itself (``json.dumps`` of a dict), which cannot
send a document nested 9 000 levels deep from a process at Python's default recursion limit,
nor one that is not a JSON object at all; and it raises on every error status. The tests that
compare the API server's answers byte for byte (which code, which message) need neither:
:class:`RawApi` sends a body as given, with the content type given, and answers
``(status, message)``, the message being the ``Status`` object's for an error. Successful
answers are not parsed (they may be nested as deep as what was sent); :meth:`RawApi.metadata`
reads an object's metadata alone (the API server's ``PartialObjectMetadata`` view), whose
``managedFields`` mirror the object's shape: parsed with the recursion limit tally itself runs
with (:data:`tally.app.recursion.RECURSION_LIMIT`).
"""

from __future__ import annotations

import base64
import json
import ssl
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import aiohttp
import yaml

from tally.app.recursion import RECURSION_LIMIT

METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


class Answer(NamedTuple):
    status: int
    message: str
    """The ``Status`` object's message for an error status; "" for a success."""


class RawApi:
    """``async with RawApi(kubeconfig) as api:`` the first cluster and user of an admin
    kubeconfig (client certificate or token), over one aiohttp session."""

    def __init__(self, kubeconfig: Path) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        self.server = str(cluster["server"]).rstrip("/")
        context = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
        self._headers: dict[str, str] = {}
        if "token" in user:
            self._headers["Authorization"] = f"Bearer {user['token']}"
        else:
            directory = Path(tempfile.mkdtemp(prefix="tally-raw-api-"))
            cert, key = directory / "client.crt", directory / "client.key"
            cert.write_bytes(base64.b64decode(user["client-certificate-data"]))
            key.write_bytes(base64.b64decode(user["client-key-data"]))
            key.chmod(0o600)
            context.load_cert_chain(cert, key)
        self._context = context
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> RawApi:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._context),
            timeout=aiohttp.ClientTimeout(total=60),
        )
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        *,
        content_type: str = "application/json",
        query: Sequence[tuple[str, str]] = (),
    ) -> Answer:
        assert self._session is not None, "use RawApi as an async context manager"
        headers = {**self._headers, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        data = body.encode() if isinstance(body, str) else body
        async with self._session.request(
            method, self.server + path, data=data, headers=headers, params=list(query)
        ) as response:
            raw = await response.read()
            if response.status < 400:
                return Answer(response.status, "")
            try:
                message = str(json.loads(raw).get("message", ""))
            except ValueError:
                message = raw.decode(errors="replace")
            return Answer(response.status, message)

    async def metadata(self, path: str) -> Mapping[str, Any]:
        """``metadata`` of the object at ``path`` (however deep its content is nested)."""
        assert self._session is not None, "use RawApi as an async context manager"
        headers = {**self._headers, "Accept": METADATA_ONLY}
        async with self._session.get(self.server + path, headers=headers) as response:
            response.raise_for_status()
            raw = await response.read()
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, RECURSION_LIMIT))
        try:
            found = json.loads(raw)
        finally:
            sys.setrecursionlimit(limit)
        return dict(found["metadata"])
