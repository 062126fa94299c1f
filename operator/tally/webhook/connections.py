"""The webhook server's connections: accepted and put through TLS by tally, each bounded in how
long its peer may take to send, and at most so many open; served by aiohttp's request handler.

Why tally accepts them itself: aiohttp's ``TCPSite`` passes ``ssl=`` to
``loop.create_server``, which gives every accepted connection asyncio's TLS protocol (a 256 KiB
buffer) at once and waits 60 s for its handshake, and aiohttp's handler bounds nothing but an
idle keep-alive (3 630 s by default). Idle and slow peers then add up to whatever they open.

:class:`GuardedSite` is an aiohttp ``BaseSite`` whose ``start`` calls ``loop.create_server``
with :meth:`ConnectionGuard.accept` as the protocol factory. Each accepted TCP connection is a
``_Connection``: it counts against the cap before anything is allocated for TLS, makes its
handshake through ``loop.start_tls``, then hands the decrypted stream to the protocol the
runner's server makes (aiohttp's request handler) and passes every call on to it.

A connection is closed when its peer is late:

1. its TLS handshake not done ``tls_handshake_timeout`` after the accept;
2. waiting for a request (after the handshake, or after the previous response), no byte of one
   within ``keepalive_timeout``. This is longer than the API server keeps an idle connection
   (:data:`tally.webhook.limits.KEEPALIVE_TIMEOUT_S`), for a connection that never sent a
   request too: Go's client may dial a connection for a request another one then served, and
   keep it idle for later;
3. a request's head not complete ``header_timeout`` after its first byte;
4. its body not read, or the response not written, within ``body_timeout``: that one the
   server's handler enforces (:mod:`tally.webhook.server`), and it tells the guard when a
   request is in progress (:meth:`ConnectionGuard.begin` / :meth:`~ConnectionGuard.end`).

At most ``max_connections`` are open, handshakes included, counted as the kernel counts them:
the room a new connection needs is made when asyncio asks for its protocol (a loop turn before
it hands the socket over), and a closed connection's socket is shut down at once, not at the
loop's next turn, which a loop busy with watch events makes long. One accepted past the cap
closes the connection that has been idle the longest: no request in progress, whether it waits for
its handshake, for a request, or for the rest of a slow head (whose first byte does not refresh
its place), so that idle or slow peers cannot keep the API server's connections out. Only when
every open connection has a request in progress is the new one closed, before its handshake.
A connection closed to make room or for a timeout is aborted: it has no request in progress and
nothing left to send.

"No request in progress" is judged by what has arrived, not only by what the handler began: a
connection whose request head is complete (its handler starts a loop turn later) or whose socket
holds bytes the loop has not read yet (a loop busy with watch events reads them late) is never
the one closed to make room. The API server may just have written a review on it, and Go's
client does not send a POST again once its bytes were written: closing it would refuse a create
no quota refused. A peer that only ever sends part of a head stays closable: its bytes are read
at the loop's next turn and it has no complete head.

What this relies on in aiohttp: ``BaseRunner.server``, documented as a protocol factory for
``create_server``; ``BaseSite.start``/``stop`` registering the site with its runner; and
``request.transport`` being the transport the protocol was given (the connection guard finds
a request's connection by it). Undocumented: ``BaseSite.stop`` closes the site's ``_server``
only when it is set; this site never sets it and closes its own listener, so the runner's
``addresses`` lists nothing for it (:attr:`GuardedSite.addresses` does). The unit tests pin
that a request's connection is found (a served connection is never closed by a timer, a cap
finds the idle one) and that a stopped server refuses connections.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import fcntl
import logging
import socket
import ssl
import struct
import termios
from collections.abc import Callable
from typing import Any, Final

import aiohttp.web

from tally.webhook.limits import WebhookLimits

logger = logging.getLogger(__name__)

REPORT_PERIOD_S: Final = 60.0
"""At most one warning this often about connections closed to make room or refused."""

END_OF_HEAD: Final = b"\r\n\r\n"
"""What ends an HTTP/1.1 request head."""


class _State(enum.Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


class _Connection(asyncio.Protocol):
    """One accepted connection: TCP, then TLS, then aiohttp's protocol behind it."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self.state = _State.HANDSHAKE
        self.raw: asyncio.Transport | None = None
        """The TCP transport, until TLS takes it over."""
        self.transport: asyncio.Transport | None = None
        """The TLS transport, once the handshake is done."""
        self.inner: asyncio.Protocol | None = None
        """aiohttp's protocol, made once the handshake is done."""
        self.serving = 0
        """Requests in progress (between the end of their head and their response written)."""
        self.head_started = False
        """Bytes of a request arrived while none was in progress."""
        self.head_complete = False
        """The head of a request not yet in progress arrived whole: its handler is about to
        begin."""
        self._head_tail = b""
        """The last bytes of a head still arriving, for an end split between two reads."""
        self.timer: asyncio.TimerHandle | None = None
        self._early: list[bytes] = []
        self._handshake: asyncio.Task[None] | None = None
        self.admitted = False
        """Counted against the cap when made (:meth:`ConnectionGuard.accept`)."""

    def __repr__(self) -> str:
        peer = (self.transport or self.raw).get_extra_info("peername") if self.raw else None
        return f"<webhook connection {peer} {self.state.value}>"

    # asyncio's calls: connection_made once, from the listener, with the TCP transport; the
    # others from TLS once the handshake began.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        # The handshake takes the stream over from here: no byte may reach this protocol first.
        transport.pause_reading()
        self.raw = transport
        if not self.admitted or self.state is _State.CLOSED:
            # Refused at the cap, or closed to make room before asyncio handed it over.
            self.abort()
            return
        self._handshake = asyncio.get_running_loop().create_task(self._start_tls(transport))

    async def _start_tls(self, raw: asyncio.Transport) -> None:
        guard = self._guard
        if self.state is not _State.HANDSHAKE:
            # Closed (by its peer, or to make room) before this task's turn: TLS would wait
            # out its handshake timeout on a transport that is gone.
            return
        try:
            tls = await asyncio.get_running_loop().start_tls(
                raw,
                self,
                guard.context,
                server_side=True,
                ssl_handshake_timeout=guard.limits.tls_handshake_timeout,
                # A TLS close waits for the peer's close_notify; bounded like the handshake.
                ssl_shutdown_timeout=guard.limits.tls_handshake_timeout,
            )
        except asyncio.CancelledError:
            guard.forget(self)
            raise
        except Exception as error:  # a timeout, a bad handshake, a peer gone: all end it
            logger.debug("TLS handshake with %s failed: %s", raw.get_extra_info("peername"), error)
            guard.forget(self)
            return
        if tls is None or self.state is not _State.HANDSHAKE:
            # Closed to make room (or lost) between the handshake's end and this task's turn.
            if tls is not None:
                tls.abort()
            return
        self.transport = tls
        self.state = _State.OPEN
        self.inner = guard.make_protocol()
        self.inner.connection_made(tls)
        guard.opened(self)
        early, self._early = self._early, []
        for data in early:
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            # TLS delivers what came with the end of the handshake before start_tls returns.
            self._early.append(data)
            return
        if not self.serving and self.state is _State.OPEN and not self.head_complete:
            if not self.head_started:
                self.head_started = True
                self._guard.head_started(self)
            keep = len(END_OF_HEAD) - 1
            if END_OF_HEAD in data or END_OF_HEAD in self._head_tail + data[:keep]:
                self.head_complete = True
                self._head_tail = b""
            else:
                self._head_tail = (self._head_tail + data[-keep:])[-keep:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = _State.CLOSED
        self._guard.forget(self)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner is not None:
            self.inner.resume_writing()

    def request_began(self) -> None:
        """Its handler took the request over: the next bytes start a new head."""
        self.head_started = self.head_complete = False
        self._head_tail = b""

    def request_arriving(self) -> bool:
        """Whether a request may be on its way on this connection, though none is in progress:
        its head arrived whole, or its socket holds bytes the loop has not read yet."""
        if self.head_complete:
            return True
        sock = self.raw.get_extra_info("socket") if self.raw is not None else None
        if sock is None:
            return False
        try:
            unread = fcntl.ioctl(sock.fileno(), termios.FIONREAD, struct.pack("i", 0))
        except OSError:
            return False  # closed under us: nothing arrives on it any more
        return bool(struct.unpack("i", unread)[0])

    def abort(self) -> None:
        self.state = _State.CLOSED
        transport = self.transport or self.raw
        if transport is not None:
            # The connection leaves the kernel's established ones now: asyncio closes the
            # socket only at the loop's next turn, which a busy loop makes late, and the cap
            # is about what is open.
            raw = self.raw.get_extra_info("socket") if self.raw is not None else None
            if raw is not None:
                with contextlib.suppress(OSError):
                    raw.shutdown(socket.SHUT_RDWR)
            transport.abort()


class ConnectionGuard:
    """The open connections of one listener: the cap, the timeouts, who is idle the longest."""

    def __init__(
        self,
        limits: WebhookLimits,
        context: ssl.SSLContext,
        make_protocol: Callable[[], asyncio.Protocol],
    ) -> None:
        self.limits: Final = limits
        self.context: Final = context
        self.make_protocol: Final = make_protocol
        self._open: dict[_Connection, None] = {}
        """Every connection admitted and not yet closed (insertion-ordered set)."""
        self._idle: collections.OrderedDict[_Connection, None] = collections.OrderedDict()
        """The open connections with no request in progress, idle the longest first."""
        self._by_transport: dict[asyncio.BaseTransport, _Connection] = {}
        self._made_room = 0
        self._refused = 0
        self._reported_at: float | None = None

    def __len__(self) -> int:
        return len(self._open)

    def accept(self) -> asyncio.Protocol:
        """The listener's protocol factory: asyncio calls it for each accepted socket a loop
        turn before handing the socket over (``connection_made``), so the room a new connection
        needs is made here, a turn sooner."""
        connection = _Connection(self)
        connection.admitted = self.admit(connection)
        return connection

    def admit(self, connection: _Connection) -> bool:
        """Room for one more, closing the longest idle if needed; False: every open connection
        is serving a request."""
        if len(self._open) >= self.limits.max_connections:
            victim = self._longest_idle()
            if victim is None:
                self._refused += 1
                self._report()
                return False
            logger.debug("closing %r, idle the longest, to make room", victim)
            self._close(victim)
            self._made_room += 1
            self._report()
        self._open[connection] = None
        self._idle[connection] = None
        return True

    def _longest_idle(self) -> _Connection | None:
        """The connection idle the longest on which no request is arriving (module
        docstring); None when there is none."""
        for connection in self._idle:
            if not connection.request_arriving():
                return connection
        return None

    def opened(self, connection: _Connection) -> None:
        """The handshake is done: wait for a request."""
        assert connection.transport is not None
        self._by_transport[connection.transport] = connection
        self._arm(connection, self.limits.keepalive_timeout, "no request came")

    def head_started(self, connection: _Connection) -> None:
        self._arm(connection, self.limits.header_timeout, "its request head did not end")

    def begin(self, transport: asyncio.BaseTransport | None) -> _Connection | None:
        """A request's head arrived on ``transport``: no timer of the guard runs while it is
        served, and the connection is not idle."""
        connection = self._by_transport.get(transport) if transport is not None else None
        if connection is None:
            return None
        connection.serving += 1
        connection.request_began()
        self._idle.pop(connection, None)
        self._disarm(connection)
        return connection

    def end(self, connection: _Connection | None) -> None:
        """The response to a request :meth:`begin` reported is written."""
        if connection is None:
            return
        connection.serving -= 1
        if connection.serving or connection.state is not _State.OPEN:
            return
        self._idle[connection] = None
        self._arm(connection, self.limits.keepalive_timeout, "no request came")

    def abort(self, transport: asyncio.BaseTransport | None) -> None:
        """Close the connection of ``transport`` at once (a peer too slow to answer)."""
        connection = self._by_transport.get(transport) if transport is not None else None
        if connection is not None:
            self._close(connection)
        elif isinstance(transport, asyncio.Transport):
            transport.abort()

    def close_handshakes(self) -> None:
        """Close every connection still in its handshake (stopping: aiohttp closes the rest)."""
        for connection in [c for c in self._open if c.state is _State.HANDSHAKE]:
            self._close(connection)

    def stop_timers(self) -> None:
        for connection in self._open:
            self._disarm(connection)

    def forget(self, connection: _Connection) -> None:
        """``connection`` is closed (by its peer, aiohttp or a failed handshake)."""
        connection.state = _State.CLOSED
        self._disarm(connection)
        self._open.pop(connection, None)
        self._idle.pop(connection, None)
        if connection.transport is not None:
            self._by_transport.pop(connection.transport, None)

    def _close(self, connection: _Connection) -> None:
        # Forgotten before the socket closes (in this loop turn), so that the count never
        # includes a connection on its way out.
        self.forget(connection)
        connection.abort()

    def _arm(self, connection: _Connection, delay: float, why: str) -> None:
        self._disarm(connection)
        connection.timer = asyncio.get_running_loop().call_later(
            delay, self._expire, connection, why
        )

    def _disarm(self, connection: _Connection) -> None:
        if connection.timer is not None:
            connection.timer.cancel()
            connection.timer = None

    def _expire(self, connection: _Connection, why: str) -> None:
        connection.timer = None
        if connection.state is _State.OPEN and not connection.serving:
            logger.debug("closing %r: %s in time", connection, why)
            self._close(connection)

    def _report(self) -> None:
        # A cap reached often means it is too low for the cluster, or someone holds
        # connections open on purpose: worth a warning, but not one per connection.
        now = asyncio.get_running_loop().time()
        if self._reported_at is not None and now - self._reported_at < REPORT_PERIOD_S:
            return
        logger.warning(
            "webhook connections at their cap (%d, TALLY_WEBHOOK_MAX_CONNECTIONS): %d idle "
            "ones closed to make room, %d new ones refused (every connection was serving)",
            self.limits.max_connections, self._made_room, self._refused,
        )  # fmt: skip
        self._reported_at = now
        self._made_room = self._refused = 0


class GuardedSite(aiohttp.web.BaseSite):
    """An aiohttp site listening on ``host:port`` whose connections a :class:`ConnectionGuard`
    accepts, puts through TLS and bounds."""

    def __init__(
        self,
        runner: aiohttp.web.BaseRunner,
        host: str,
        port: int,
        *,
        guard: ConnectionGuard,
        backlog: int = 128,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._listen_backlog = backlog
        self.guard: Final = guard
        self._listener: asyncio.Server | None = None

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._port}"

    @property
    def addresses(self) -> list[Any]:
        """The listening sockets' addresses (``(host, port)`` for IPv4)."""
        if self._listener is None:
            return []
        return [sock.getsockname() for sock in self._listener.sockets]

    async def start(self) -> None:
        await super().start()
        self._listener = await asyncio.get_running_loop().create_server(
            self.guard.accept, self._host, self._port, backlog=self._listen_backlog
        )

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self.guard.close_handshakes()
        await super().stop()
