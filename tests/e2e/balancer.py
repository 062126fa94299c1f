"""A round-robin TCP balancer on loopback, for webhook replicas behind one address.

What a Service (kube-proxy) or a cloud load balancer does in front of a Deployment's pods:
each new connection goes to the next backend, bytes are passed through untouched (TLS ends at
the replica, so the API server's client certificate reaches it). tally's webhook server speaks
HTTP/1.1 only, so the API server opens a connection per concurrent review and a burst spreads
over both replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Sequence


class RoundRobinBalancer:
    """Listens on ``127.0.0.1:<port>`` and hands connections to the ``backends()`` ports in
    turn (asked per connection: replicas' ports are known only once they start; while there
    are none, connections are closed)."""

    def __init__(self, backends: Callable[[], Sequence[int]]) -> None:
        self.backends = backends
        self.connections: Counter[int] = Counter()
        """Connections handed to each backend port."""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._next = 0
        self._pipes: set[asyncio.Task[None]] = set()
        self._open: set[asyncio.StreamWriter] = set()
        """Both ends of every connection passed through now: what :meth:`cut` breaks."""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    def _closed(self, end: asyncio.StreamWriter, _: asyncio.Task[None]) -> None:
        self._open.discard(end)

    def cut(self) -> int:
        """Break every established connection at once, as a node or a proxy that goes away
        does: both ends are aborted (a reset, not a polite close), mid-request or idle. New
        connections are accepted as before. Returns how many connections were cut."""
        ends = list(self._open)
        for end in ends:
            end.transport.abort()
        return len(ends) // 2

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backends = self.backends()
        if not backends:
            writer.close()
            return
        backend = backends[self._next % len(backends)]
        self._next += 1
        self.connections[backend] += 1
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", backend)
        except OSError:
            writer.close()
            return
        self._open.update((writer, upstream_writer))
        for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
            task = asyncio.create_task(_pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)
            task.add_done_callback(functools.partial(self._closed, sink))


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy ``source`` to ``sink`` until it ends."""
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            sink.close()
