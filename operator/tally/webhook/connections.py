"""The webhook server's connections: accepted and put through TLS by tally, each bounded in how
long its peer may take to send, and at most so many open; served by aiohttp's request handler.

Why tally accepts them itself: aiohttp's ``TCPSite`` passes ``ssl=`` to
``loop.create_server``, which gives every accepted connection asyncio's TLS protocol (a 256 KiB
buffer) at once and waits 60 s for its handshake, and aiohttp's handler bounds nothing but an
idle keep-alive (3 630 s by default). Idle and slow peers then add up to whatever they open.

:class:`GuardedSite` is an aiohttp ``BaseSite`` with listening sockets of its own, whose
connections it accepts (``loop.sock_accept``) and hands to :meth:`ConnectionGuard.accept` in the
turn they arrive. Each is a ``_Connection``: it counts against the cap before anything is
allocated for TLS, makes its handshake through ``loop.connect_accepted_socket`` (TLS is the
socket's protocol from its first byte, on asyncio's loop and on uvloop's, which Kopf's CLI runs
when it is installed), then hands the decrypted stream to the protocol the runner's server makes
(aiohttp's request handler) and passes every call on to it.

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
the room a new connection needs is made in the turn it is accepted, and a closed connection's
socket is shut down at once, not at the loop's next turn, which a loop busy with watch events
makes long. One accepted past the cap closes the connection that has been idle the longest: no
request in progress, whether it waits for its handshake, for a request, or for the rest of a
slow head (whose first byte does not refresh its place), so that idle or slow peers cannot keep
the API server's connections out. Only when
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
only when it is set; this site never sets it and closes its own listeners, so the runner's
``addresses`` lists nothing for it (:attr:`GuardedSite.addresses` does). The unit tests pin
that a request's connection is found (a served connection is never closed by a timer, a cap
finds the idle one) and that a stopped server refuses connections, on asyncio's loop and on
uvloop's.
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
import traceback
from collections.abc import Callable
from typing import Any, Final, cast

import aiohttp.web

from tally.webhook.limits import WebhookLimits
from tally.workqueue.tasks import cancel_and_wait, start_watched

logger = logging.getLogger(__name__)

REPORT_PERIOD_S: Final = 60.0
"""At most one warning this often about connections closed to make room or refused, and one
about connections that could not be accepted."""

ACCEPT_BATCH: Final = 4
"""Connections accepted in one loop turn at most, when more are waiting. Each begins its TLS
handshake in the next turn, and a burst whose handshakes all begin at once holds their buffers
together: under ``tests/e2e/test_hostile_clients.py`` (550 clients connecting at once against
the cap of 256, with mutual TLS) tally's RSS peaked at 232 MiB taking 128 a turn (as many as
asyncio's own servers take), 212 MiB taking 16, 204 MiB taking 4 and 205 MiB taking one; the
listener before, asyncio's, at 203 MiB. One a turn would leave a burst of the API server's new
connections waiting a turn each while the loop is busy."""

ACCEPT_PAUSE_S: Final = 1.0
"""How long the listener waits after an accept failed (out of file descriptors: asyncio's own
servers pause as long)."""

END_OF_HEAD: Final = b"\r\n\r\n"
"""What ends an HTTP/1.1 request head."""


class _State(enum.Enum):
    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


class _Connection(asyncio.Protocol):
    """One accepted connection: its socket, TLS over it, then aiohttp's protocol behind it."""

    def __init__(self, guard: ConnectionGuard, sock: socket.socket) -> None:
        self._guard = guard
        self.sock = sock
        """The accepted socket: the handshake's, then the TLS transport's."""
        self.state = _State.HANDSHAKE
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
        self._handshake: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        try:
            peer = self.sock.getpeername()
        except OSError:
            peer = None
        return f"<webhook connection {peer} {self.state.value}>"

    def start_handshake(self) -> None:
        self._handshake = asyncio.get_running_loop().create_task(self._start_tls())

    async def _start_tls(self) -> None:
        guard = self._guard
        if self.state is not _State.HANDSHAKE:
            # Closed to make room before this task's turn: nothing took the socket over.
            self.sock.close()
            return
        try:
            # TLS is this connection's protocol from the socket's first byte: a loop that reads
            # an accepted socket as soon as it hands it over (uvloop's, which Kopf's CLI runs
            # when it is installed, resumes reading after ``connection_made`` whatever that
            # paused) has no plain bytes to give anyone else.
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: self,
                self.sock,
                ssl=guard.context,
                ssl_handshake_timeout=guard.limits.tls_handshake_timeout,
                # A TLS close waits for the peer's close_notify; bounded like the handshake.
                ssl_shutdown_timeout=guard.limits.tls_handshake_timeout,
            )
        except asyncio.CancelledError:
            guard.forget(self)
            raise
        except Exception as error:  # a timeout, a bad handshake, a peer gone: all end it
            logger.debug("TLS handshake with %r failed: %s", self, error)
            guard.forget(self)
            _release(error)
            # Mostly closed already by the transport that failed; a socket closed twice (or
            # while uvloop still holds it) is closed once.
            self.sock.close()

    # asyncio's calls, from TLS once the handshake is done.

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, whatever its class: uvloop's derive from no asyncio class.
        tls = cast(asyncio.Transport, transport)
        if self.state is not _State.HANDSHAKE:
            # Closed to make room (or lost) in the turn its handshake ended.
            tls.abort()
            return
        self.transport = tls
        self.state = _State.OPEN
        self.inner = self._guard.make_protocol()
        self.inner.connection_made(tls)
        self._guard.opened(self)

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return  # closed in the turn its handshake ended: nobody reads it
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
        try:
            unread = fcntl.ioctl(self.sock.fileno(), termios.FIONREAD, struct.pack("i", 0))
        except (OSError, ValueError):
            return False  # closed under us: nothing arrives on it any more
        return bool(struct.unpack("i", unread)[0])

    def abort(self) -> None:
        self.state = _State.CLOSED
        # The connection leaves the kernel's established ones now: a transport closes its
        # socket only at the loop's next turn, which a busy loop makes late, and the cap is
        # about what is open. A handshake under way then fails on the shut socket (asyncio
        # closes the transport it made); one not begun yet finds the connection closed and
        # closes the socket itself.
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        if self.transport is not None:
            self.transport.abort()


def _release(error: BaseException) -> None:
    """Let what a failed handshake's frames held go now: the traceback keeps the frames of
    asyncio's transport set-up alive, and with them the transport, its TLS buffers (256 KiB) and
    this connection, in a cycle through the future that carried the error; only a full
    collection would free it, and tally makes those rare (:mod:`tally.app.heap`). Under
    ``tests/e2e/test_hostile_clients.py`` about a hundred connections closed in their handshake
    were held at a time, a TLS buffer each."""
    traceback.clear_frames(error.__traceback__)


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

    def accept(self, sock: socket.socket) -> bool:
        """Take ``sock``, just accepted: counted against the cap (making room, or closed at
        once if there is none) before anything is allocated for TLS, then its handshake begun.
        False: refused at the cap."""
        connection = _Connection(self, sock)
        if not self.admit(connection):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            return False
        connection.start_handshake()
        return True

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
        self._listeners: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._accept_failures_reported_at: float | None = None

    @property
    def name(self) -> str:
        return f"https://{self._host}:{self._port}"

    @property
    def addresses(self) -> list[Any]:
        """The listening sockets' addresses (``(host, port)`` for IPv4)."""
        return [sock.getsockname() for sock in self._listeners]

    async def start(self) -> None:
        await super().start()
        self._listeners = await listen(self._host, self._port, self._listen_backlog)
        self._accepting = [
            start_watched(self._accept(listener), name=f"webhook-accept-{index}", logger=logger)
            for index, listener in enumerate(self._listeners)
        ]

    async def _accept(self, listener: socket.socket) -> None:
        """Hand each connection ``listener`` accepts to the guard, in the turn it arrives, the
        loop's turn given back after every :data:`ACCEPT_BATCH`."""
        loop = asyncio.get_running_loop()
        accepted = 0
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except ConnectionError:
                continue  # its peer left before it was accepted
            except OSError as error:
                # Out of file descriptors or memory: as asyncio's own servers do, go on
                # accepting after a pause, saying why.
                self._report_accept_failure(loop.time(), error)
                await asyncio.sleep(ACCEPT_PAUSE_S)
                continue
            sock.setblocking(False)
            self.guard.accept(sock)
            accepted += 1
            if accepted % ACCEPT_BATCH == 0:
                await asyncio.sleep(0)

    def _report_accept_failure(self, now: float, error: OSError) -> None:
        reported = self._accept_failures_reported_at
        if reported is not None and now - reported < REPORT_PERIOD_S:
            return
        self._accept_failures_reported_at = now
        logger.warning(
            "the webhook server could not accept a connection (%s); accepting again in %g s",
            error, ACCEPT_PAUSE_S,
        )  # fmt: skip

    async def stop(self) -> None:
        accepting, self._accepting = self._accepting, []
        # One that died was logged when it did; the stop goes on.
        await asyncio.gather(*(cancel_and_wait(t) for t in accepting if not t.done()))
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.close()
        self.guard.close_handshakes()
        await super().stop()


async def listen(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (as ``loop.create_server`` binds
    them: address reuse, IPv6 sockets for IPv6 only), non-blocking."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    listeners: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            listeners.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners
