"""tally.webhook.server: tally's own admission endpoint over TLS on loopback.

What the API server sees for each kind of answer: a verdict in an AdmissionReview (allowed, or
refused with a code and message), a 400 naming what is wrong with a body that is no
AdmissionReview it could have sent (not JSON, nested deeper than it stores, an integer it never
sends), a 404 for a path no webhook serves, a 413 for a body past the limit, a 429 when tally
holds as many reviews as it may, and a refusal (never an allow) when a handler fails. What its
connections meet: timeouts on slow or silent peers, a cap that closes the longest idle
connection first, and a retried review judged once.

Real servers and clients on loopback with small limits and timeouts; no mock of either side.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib
import inspect
import io
import json
import logging
import os
import socket
import ssl
import struct
import sys
import termios
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import pytest
from policy_webhook import loopback_tls

from tally.admission.attributes import Attributes
from tally.admission.errors import AdmissionDenied
from tally.app.recursion import raise_recursion_limit
from tally.webhook.connections import ConnectionGuard
from tally.webhook.limits import MAX_BODY_BYTES, WebhookLimits
from tally.webhook.server import (
    MAX_OBJECT_DEPTH,
    MAX_REVIEW_DEPTH,
    WebhookServer,
    podset_review,
    quota_review,
    review_response,
)

pytestmark = pytest.mark.unit

MiB = 1024 * 1024
PATIENCE_S = 5.0
"""How long a test waits for something that must happen (generous: a loaded machine)."""


def _review(
    obj: dict[str, Any],
    *,
    resource: str = "pods",
    group: str = "",
    uid: str = "u-1",
    old: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "resource": {"group": group, "version": "v1", "resource": resource},
            "namespace": "ns",
            "name": obj["metadata"]["name"],
            "operation": "UPDATE" if old is not None else "CREATE",
            "userInfo": {"username": "alice"},
            "object": obj,
            "oldObject": old,
            "dryRun": False,
        },
    }


def _deep_review(object_depth: int, *, uid: str = "u-deep") -> bytes:
    """A pod review whose object nests ``object_depth`` levels (the object itself is level 1,
    its ``spec`` 2, arrays below that), written as text: nothing here recurses."""
    arrays = object_depth - 2
    head = json.dumps(_review({"metadata": {"name": "deep"}, "spec": {}}, uid=uid))
    assert head.count('"spec": {}') == 1
    return head.replace('"spec": {}', '"spec": {"x": ' + "[" * arrays + "]" * arrays + "}").encode()


class Reply(NamedTuple):
    status: int
    reason: str
    headers: dict[str, str]
    body: Any
    """The JSON answer; None when the body is not JSON (aiohttp's text for an error status)."""


class Client:
    def __init__(self, base: str, context: ssl.SSLContext) -> None:
        self.base = base
        self.context = context

    async def reply(self, path: str, body: bytes | Any) -> Reply:
        """POST on a connection of its own (a new session each time)."""
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.base + path, data=body, ssl=self.context) as response,
        ):
            text = await response.text()
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError:
                parsed = None
            return Reply(response.status, str(response.reason), dict(response.headers), parsed)

    async def post(self, path: str, body: bytes) -> tuple[int, str, Any]:
        reply = await self.reply(path, body)
        return reply.status, reply.reason, reply.body


class Served(NamedTuple):
    server: WebhookServer
    client: Client
    port: int
    context: ssl.SSLContext
    """The client's TLS context (trusts the server's CA)."""


@contextlib.asynccontextmanager
async def serving(
    handlers: dict[str, Any], limits: WebhookLimits | None = None
) -> AsyncIterator[Served]:
    context, material = loopback_tls()
    server = WebhookServer(handlers, addr="127.0.0.1", port=0, context=context, limits=limits)
    await server.start()
    port = server.addresses[0][1]
    client_context = ssl.create_default_context(cadata=material.ca_bundle.decode())
    try:
        yield Served(
            server, Client(f"https://127.0.0.1:{port}", client_context), port, client_context
        )
    finally:
        await server.stop()


@pytest.fixture
async def served() -> AsyncIterator[tuple[Client, list[Attributes]]]:
    seen: list[Attributes] = []

    async def admit(attributes: Attributes) -> None:
        seen.append(attributes)
        if attributes.name == "denied":
            raise AdmissionDenied(403, "exceeded quota: q, requested: pods=1")
        if attributes.name == "broken":
            raise RuntimeError("boom")

    async with serving({"quota": quota_review(admit), "validate-podsets": podset_review}) as s:
        yield s.client, seen


class Gate:
    """A review handler that records each review and answers only once released."""

    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, review: dict[str, Any]) -> dict[str, Any]:
        self.reviews.append(review)
        self.entered.set()
        await self.release.wait()
        return review_response(review, True)


async def _eventually(condition: Callable[[], bool], what: str) -> None:
    # Polls: the server's counters have no event to wait on, and a test needs none.
    try:
        async with asyncio.timeout(PATIENCE_S):
            while not condition():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"not within {PATIENCE_S} s: {what}") from None


async def _tls(served: Served) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", served.port, ssl=served.context)


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the server closed the connection within ``seconds`` (what it sent meanwhile is
    read and dropped)."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        pass
    return True


def _http_request(path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_status(reader: asyncio.StreamReader) -> int:
    """The status of the next response, whose head and body are read."""
    async with asyncio.timeout(PATIENCE_S):
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)
    return status


@contextlib.contextmanager
def _recursion_limit_as_tally_sets_it() -> Iterator[None]:
    before = sys.getrecursionlimit()
    raise_recursion_limit()
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


# --- verdicts ------------------------------------------------------------------------------------


async def test_an_allowed_request(served: tuple[Client, list[Attributes]]) -> None:
    client, seen = served
    status, _, body = await client.post(
        "/quota", json.dumps(_review({"metadata": {"name": "p"}})).encode()
    )
    assert 200 == status
    assert {"uid": "u-1", "allowed": True} == body["response"]
    assert ("ns", "p", "CREATE") == (seen[0].namespace, seen[0].name, seen[0].operation)


async def test_the_first_review_from_each_address_is_logged(
    served: tuple[Client, list[Attributes]], caplog: pytest.LogCaptureFixture
) -> None:
    # Where the API server calls from is what a NetworkPolicy admitting it must name.
    client, _ = served
    caplog.set_level(logging.INFO, logger="tally.webhook.server")
    for name in ("a", "b"):
        await client.post("/quota", json.dumps(_review({"metadata": {"name": name}})).encode())
    noted = [r.getMessage() for r in caplog.records if "first review from" in r.getMessage()]
    assert ["webhook: first review from 127.0.0.1"] == noted


async def test_a_refusal_carries_code_and_message(served: tuple[Client, list[Attributes]]) -> None:
    client, _ = served
    status, _, body = await client.post(
        "/quota", json.dumps(_review({"metadata": {"name": "denied"}})).encode()
    )
    assert 200 == status
    assert {
        "uid": "u-1",
        "allowed": False,
        "status": {"code": 403, "message": "exceeded quota: q, requested: pods=1"},
    } == body["response"]


async def test_a_failing_handler_refuses(served: tuple[Client, list[Attributes]]) -> None:
    client, _ = served
    status, _, body = await client.post(
        "/quota", json.dumps(_review({"metadata": {"name": "broken"}})).encode()
    )
    assert 200 == status
    assert (False, 500, "tally failed: boom") == (
        body["response"]["allowed"],
        body["response"]["status"]["code"],
        body["response"]["status"]["message"],
    )


async def test_no_review_is_a_400_naming_the_problem(
    served: tuple[Client, list[Attributes]],
) -> None:
    client, seen = served
    status, reason, body = await client.post("/quota", b"{")
    assert (400, None) == (status, body)
    assert "the body is not JSON" in reason
    assert [] == seen


async def test_an_unknown_path_is_a_404(served: tuple[Client, list[Attributes]]) -> None:
    client, _ = served
    status, _, _ = await client.post(
        "/mutate", json.dumps(_review({"metadata": {"name": "p"}})).encode()
    )
    assert 404 == status


async def test_an_invalid_podset_is_a_422(served: tuple[Client, list[Attributes]]) -> None:
    client, _ = served
    podset = {"metadata": {"name": "web"}, "spec": {"replicas": -1}}
    status, _, body = await client.post(
        "/validate-podsets",
        json.dumps(_review(podset, resource="podsets", group="tally.dev")).encode(),
    )
    assert 200 == status
    assert (False, 422) == (body["response"]["allowed"], body["response"]["status"]["code"])
    assert body["response"]["status"]["message"].startswith('PodSet.tally.dev "web" is invalid: ')
    assert "spec.replicas" in body["response"]["status"]["message"]


# --- bodies: size, budget, time ------------------------------------------------------------------


async def test_an_update_of_two_large_objects_is_judged(
    served: tuple[Client, list[Attributes]],
) -> None:
    # Two ConfigMaps of 1.4 MiB each, old and new: ~2.8 MiB of JSON, past aiohttp's 1 MiB
    # default, well within what the API server sends (each at most etcd's 1.5 MiB).
    client, seen = served
    old = {"metadata": {"name": "big"}, "data": {"blob": "a" * int(1.4 * MiB)}}
    new = {"metadata": {"name": "big"}, "data": {"blob": "b" * int(1.4 * MiB)}}
    body = json.dumps(_review(new, resource="configmaps", old=old)).encode()
    assert 2.8 * MiB < len(body) < MAX_BODY_BYTES
    reply = await client.reply("/quota", io.BytesIO(body))  # aiohttp's advice for a large body
    assert (200, True) == (reply.status, reply.body["response"]["allowed"])
    assert 1 == len(seen)
    assert (new, old) == (seen[0].obj, seen[0].old_obj)


@pytest.mark.parametrize(
    "chunked",
    [pytest.param(False, id="content-length"), pytest.param(True, id="chunked")],
)
async def test_a_body_past_the_limit_is_a_413_naming_it(chunked: bool) -> None:
    gate = Gate()
    gate.release.set()
    limits = WebhookLimits(max_body_bytes=64 * 1024)
    body = json.dumps(_review({"metadata": {"name": "p"}, "data": {"x": "a" * 70_000}})).encode()

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 8192):
            yield body[start : start + 8192]

    async with serving({"quota": gate}, limits) as s:
        reply = await s.client.reply("/quota", chunks() if chunked else body)
        assert 413 == reply.status
        assert "limit of 65536 bytes" in reply.reason
        assert "TALLY_WEBHOOK_MAX_BODY_BYTES" in reply.reason
        assert [] == gate.reviews
        # Nothing is held for the refused body: a review within the limit is judged after it.
        small = json.dumps(_review({"metadata": {"name": "p"}})).encode()
        assert 200 == (await s.client.reply("/quota", small)).status
        assert 0 == s.server.body_bytes_in_flight


async def test_past_the_reviews_in_flight_a_429_at_once() -> None:
    gate = Gate()
    async with serving({"quota": gate}, WebhookLimits(max_reviews_in_flight=1)) as s:
        first = asyncio.create_task(
            s.client.reply("/quota", json.dumps(_review({"metadata": {"name": "a"}})).encode())
        )
        await asyncio.wait_for(gate.entered.wait(), PATIENCE_S)
        # The first is still being judged (the gate is shut) while the second is answered.
        second = await asyncio.wait_for(
            s.client.reply(
                "/quota", json.dumps(_review({"metadata": {"name": "b"}}, uid="u-2")).encode()
            ),
            PATIENCE_S,
        )
        assert not first.done()
        assert (429, "1") == (second.status, second.headers.get("Retry-After"))
        assert "1 reviews in flight" in second.reason
        gate.release.set()
        assert 200 == (await first).status
        assert ["a"] == [r["request"]["name"] for r in gate.reviews]


async def test_past_the_body_budget_a_429_at_once() -> None:
    gate = Gate()
    limits = WebhookLimits(max_body_bytes=64 * 1024, body_budget_bytes=64 * 1024)
    large = {"metadata": {"name": "large"}, "data": {"x": "a" * 50_000}}
    small = {"metadata": {"name": "small"}, "data": {"x": "b" * 20_000}}
    async with serving({"quota": gate}, limits) as s:
        first = asyncio.create_task(s.client.reply("/quota", json.dumps(_review(large)).encode()))
        await asyncio.wait_for(gate.entered.wait(), PATIENCE_S)
        # 50 KB held while it is judged; 20 KB more would pass the 64 KiB budget.
        assert s.server.body_bytes_in_flight > 50_000
        second = await asyncio.wait_for(
            s.client.reply("/quota", json.dumps(_review(small, uid="u-2")).encode()), PATIENCE_S
        )
        assert (429, "1") == (second.status, second.headers.get("Retry-After"))
        assert "65536 bytes of review bodies in flight" in second.reason
        gate.release.set()
        assert 200 == (await first).status
        assert 0 == s.server.body_bytes_in_flight
        assert (
            200
            == (
                await s.client.reply("/quota", json.dumps(_review(small, uid="u-3")).encode())
            ).status
        )


async def test_a_body_that_does_not_arrive_in_time_is_a_408() -> None:
    gate = Gate()
    gate.release.set()
    async with serving({"quota": gate}, WebhookLimits(body_timeout=0.3)) as s:
        reader, writer = await _tls(s)
        body = json.dumps(_review({"metadata": {"name": "p"}})).encode()
        writer.write(_http_request("/quota", body)[: -len(body) // 2])  # half the body
        assert 408 == await _read_status(reader)
        writer.close()
        assert [] == gate.reviews
        assert 0 == s.server.body_bytes_in_flight
        assert 0 == s.server.reviews_in_flight


# --- connections: timeouts and the cap -----------------------------------------------------------


async def test_a_slow_head_is_closed_after_the_header_timeout_while_others_are_served() -> None:
    gate = Gate()
    gate.release.set()
    async with serving({"quota": gate}, WebhookLimits(header_timeout=0.5)) as s:
        reader, writer = await _tls(s)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        writer.write(b"POST /quota HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
        reply = await s.client.reply(
            "/quota", json.dumps(_review({"metadata": {"name": "p"}})).encode()
        )
        assert 200 == reply.status
        assert await _closed_within(reader, PATIENCE_S)
        # Timers never fire early (by more than the loop's clock resolution).
        assert loop.time() - sent >= 0.5 - 0.01
        writer.close()


async def test_a_silent_connection_is_closed_after_the_keepalive() -> None:
    async with serving({"quota": Gate()}, WebhookLimits(keepalive_timeout=0.3)) as s:
        reader, writer = await _tls(s)
        assert await _closed_within(reader, PATIENCE_S)
        writer.close()
        await _eventually(lambda: s.server.open_connections == 0, "the connection forgotten")


async def test_an_idle_connection_is_kept_between_requests_until_the_keepalive() -> None:
    gate = Gate()
    gate.release.set()
    async with serving({"quota": gate}, WebhookLimits(keepalive_timeout=0.5)) as s:
        reader, writer = await _tls(s)
        for uid in ("u-1", "u-2"):
            body = json.dumps(_review({"metadata": {"name": "p"}}, uid=uid)).encode()
            writer.write(_http_request("/quota", body))
            assert 200 == await _read_status(reader)
        assert 2 == len(gate.reviews)
        assert await _closed_within(reader, PATIENCE_S)
        writer.close()


async def test_a_long_judgement_is_not_cut_by_the_connections_timers() -> None:
    gate = Gate()
    limits = WebhookLimits(header_timeout=0.2, keepalive_timeout=0.3)
    async with serving({"quota": gate}, limits) as s:
        reader, writer = await _tls(s)
        writer.write(
            _http_request("/quota", json.dumps(_review({"metadata": {"name": "p"}})).encode())
        )
        await asyncio.wait_for(gate.entered.wait(), PATIENCE_S)
        await asyncio.sleep(0.8)  # past both timers, while the review is judged
        gate.release.set()
        assert 200 == await _read_status(reader)
        writer.close()


async def test_a_handshake_that_never_comes_is_closed() -> None:
    async with serving({"quota": Gate()}, WebhookLimits(tls_handshake_timeout=0.3)) as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.port)  # plain TCP
        assert await _closed_within(reader, PATIENCE_S)
        writer.close()
        await _eventually(lambda: s.server.open_connections == 0, "the connection forgotten")


async def test_at_the_cap_the_longest_idle_connection_makes_room() -> None:
    gate = Gate()
    gate.release.set()
    async with serving({"quota": gate}, WebhookLimits(max_connections=2)) as s:
        oldest, oldest_writer = await _tls(s)
        await asyncio.sleep(0.05)
        newer, newer_writer = await _tls(s)
        await _eventually(lambda: s.server.open_connections == 2, "two connections open")
        reply = await s.client.reply(
            "/quota", json.dumps(_review({"metadata": {"name": "p"}})).encode()
        )
        assert 200 == reply.status
        assert await _closed_within(oldest, PATIENCE_S)
        assert not await _closed_within(newer, 0.2)
        assert s.server.open_connections <= 2
        oldest_writer.close()
        newer_writer.close()


async def test_a_connection_closed_to_make_room_is_shut_before_the_loops_next_turn() -> None:
    # The cap is about what the kernel holds open; under load a loop turn can be long, so the
    # room is made in the turn the new connection is accepted, and the idle one's socket is shut
    # down then, not a turn later.
    guard = ConnectionGuard(
        WebhookLimits(max_connections=1),
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH),  # no handshake comes here
        asyncio.Protocol,
    )
    with _Listener() as listener:
        idle = socket.create_connection(listener.address)
        second = socket.create_connection(listener.address)
        try:
            assert guard.accept(listener.next())
            assert 1 == len(guard)
            idle.setblocking(False)
            with pytest.raises(BlockingIOError):
                idle.recv(1)  # open: nothing to read yet
            assert guard.accept(listener.next())  # no await, no loop turn
            assert idle.recv(1) == b""  # the peer's FIN is already here
            assert 1 == len(guard)
        finally:
            idle.close()
            second.close()
            guard.close_handshakes()


async def test_at_the_cap_a_connection_with_unread_bytes_is_not_the_one_closed() -> None:
    # The API server's pooled connection, idle the longest, may just have carried a review the
    # loop has not read yet (it is busy): closing it would fail that create, as Go's client does
    # not send a POST again once written. The next idle one makes room instead.
    guard = ConnectionGuard(
        WebhookLimits(max_connections=2),
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH),
        asyncio.Protocol,
    )
    with _Listener() as listener:
        older = socket.create_connection(listener.address)
        newer = socket.create_connection(listener.address)
        third = socket.create_connection(listener.address)
        try:
            assert guard.accept(listener.next())
            assert guard.accept(listener.next())
            for peer in (older, newer):
                peer.setblocking(False)
            older.send(b"\x16\x03\x01")  # arrives now; read at the loop's next turn
            await _eventually(lambda: _unread(listener.accepted[0]) > 0, "the bytes arrived")
            assert guard.accept(listener.next())  # in this turn, before the bytes are read
            assert newer.recv(1) == b""  # closed to make room
            with pytest.raises(BlockingIOError):
                older.recv(1)  # still open
        finally:
            for peer in (older, newer, third):
                peer.close()
            guard.close_handshakes()


class _Listener:
    """A plain listening socket on loopback, whose connections the test accepts itself and
    hands to a guard, as the webhook server's site does (in the turn they arrive)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = self.sock.getsockname()
        self.accepted: list[socket.socket] = []

    def next(self) -> socket.socket:
        """The next connection, already made by a client (a blocking accept returns at once)."""
        sock, _ = self.sock.accept()
        sock.setblocking(False)
        self.accepted.append(sock)
        return sock

    async def serve(self, guard: ConnectionGuard) -> None:
        loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        while True:
            sock, _ = await loop.sock_accept(self.sock)
            sock.setblocking(False)
            guard.accept(sock)

    def __enter__(self) -> _Listener:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()


def _unread(sock: socket.socket) -> int:
    """Bytes the kernel holds for ``sock`` that nobody read yet."""
    try:
        unread = fcntl.ioctl(sock.fileno(), termios.FIONREAD, struct.pack("i", 0))
    except OSError:
        return 0
    return int(struct.unpack("i", unread)[0])


class _Unbegun(asyncio.Protocol):
    """aiohttp's protocol as it is between a request head's arrival and its handler's start:
    holding the bytes, nobody told the guard yet."""

    def __init__(self) -> None:
        self.received = b""

    def data_received(self, data: bytes) -> None:
        self.received += data


async def test_at_the_cap_a_connection_whose_request_head_arrived_is_not_the_one_closed() -> None:
    server_context, material = loopback_tls()
    made: list[_Unbegun] = []

    def make() -> asyncio.Protocol:
        made.append(_Unbegun())
        return made[-1]

    guard = ConnectionGuard(WebhookLimits(max_connections=2), server_context, make)
    context = ssl.create_default_context(cadata=material.ca_bundle.decode())
    writers = []
    with _Listener() as listener:
        serving = asyncio.create_task(listener.serve(guard))
        port = listener.address[1]
        try:
            older, older_writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            writers.append(older_writer)
            older_writer.write(b"POST /quota HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            older_writer.write(b"Content-Length: 0\r\n\r\n")
            await _eventually(
                lambda: len(made) == 1 and made[0].received.endswith(b"\r\n\r\n"),
                "the older connection's head arrived",
            )
            newer, newer_writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            writers.append(newer_writer)
            await _eventually(lambda: len(made) == 2, "the newer connection's handshake done")
            _, third_writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            writers.append(third_writer)
            assert await _closed_within(newer, PATIENCE_S)
            assert not await _closed_within(older, 0.2)
            assert len(guard) == 2
        finally:
            for writer in writers:
                writer.close()
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            guard.close_handshakes()


async def test_at_the_cap_with_every_connection_serving_the_new_one_is_closed() -> None:
    gate = Gate()
    async with serving({"quota": gate}, WebhookLimits(max_connections=2)) as s:
        busy = []
        for uid in ("u-1", "u-2"):
            reader, writer = await _tls(s)
            body = json.dumps(_review({"metadata": {"name": "p"}}, uid=uid)).encode()
            writer.write(_http_request("/quota", body))
            busy.append((reader, writer))
        await _eventually(lambda: len(gate.reviews) == 2, "both reviews being judged")
        with pytest.raises((ConnectionError, ssl.SSLError, asyncio.IncompleteReadError)):
            await asyncio.wait_for(_tls(s), PATIENCE_S)
        assert 2 == s.server.open_connections
        gate.release.set()
        for reader, writer in busy:
            assert 200 == await _read_status(reader)
            writer.close()


async def test_a_stopped_server_refuses_connections_and_closes_handshakes() -> None:
    async with serving({"quota": Gate()}) as s:
        port = s.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # no handshake yet
        await _eventually(lambda: s.server.open_connections == 1, "the connection accepted")
        await asyncio.wait_for(s.server.stop(), PATIENCE_S)
        assert await _closed_within(reader, PATIENCE_S)
        writer.close()
        assert [] == s.server.addresses
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


# --- JSON the API server never sends; objects as deep as it stores -------------------------------


async def test_reviews_as_deep_as_the_api_server_stores_are_judged() -> None:
    gate = Gate()
    gate.release.set()
    async with serving({"quota": gate}) as s:
        with _recursion_limit_as_tally_sets_it():
            for depth in (2_000, 9_000, MAX_OBJECT_DEPTH):
                reply = await s.client.reply("/quota", _deep_review(depth, uid=f"u-{depth}"))
                assert (200, True) == (reply.status, reply.body["response"]["allowed"])
    assert 3 == len(gate.reviews)
    # Judged whole: the last object's arrays all there.
    nested, levels = gate.reviews[-1]["request"]["object"]["spec"]["x"], 1
    while nested:
        nested, levels = nested[0], levels + 1
    assert MAX_OBJECT_DEPTH - 2 == levels


async def test_a_deep_but_valid_podset_template_is_admitted() -> None:
    arrays = 9_000 - 5  # the PodSet, spec, template, its spec, then x's arrays
    podset = {
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "c", "image": "nginx"}], "x": "DEEP"},
            },
        },
    }
    text = json.dumps(_review(podset, resource="podsets", group="tally.dev"))
    body = text.replace('"DEEP"', "[" * arrays + "]" * arrays).encode()
    async with serving({"validate-podsets": podset_review}) as s:
        with _recursion_limit_as_tally_sets_it():
            reply = await s.client.reply("/validate-podsets", body)
    assert (200, {"uid": "u-1", "allowed": True}) == (reply.status, reply.body["response"])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param(
            _deep_review(MAX_OBJECT_DEPTH + 1),
            f"nested {MAX_REVIEW_DEPTH + 1} levels deep",
            id="one-level-deeper-than-stored",
        ),
        pytest.param(
            b"[" * 100_000 + b"]" * 100_000,
            "nested too deeply to parse",
            id="deeper-than-the-recursion-limit",
        ),
        pytest.param(
            json.dumps(_review({"metadata": {"name": "p"}}))
            .encode()
            .replace(b'"dryRun": false', b'"dryRun": false, "n": ' + b"7" * 5_000),
            "an integer of more than 4300 digits",
            id="5000-digit-integer",
        ),
        pytest.param(
            json.dumps(_review({"metadata": {"name": "p"}}))
            .encode()
            .replace(b'"dryRun": false', b'"dryRun": NaN'),
            "NaN is not a JSON value",
            id="nan",
        ),
        pytest.param(b'{"a": "\xff"}', "not UTF-8", id="invalid-utf8"),
    ],
)
async def test_json_the_api_server_never_sends_is_a_400(body: bytes, reason: str) -> None:
    gate = Gate()
    gate.release.set()
    async with serving({"quota": gate}) as s:
        with _recursion_limit_as_tally_sets_it():
            reply = await s.client.reply("/quota", body)
            assert 400 == reply.status
            assert reason in reply.reason
            # Still serving, nothing judged or held.
            ok = await s.client.reply(
                "/quota", json.dumps(_review({"metadata": {"name": "p"}})).encode()
            )
        assert 200 == ok.status
        assert ["p"] == [r["request"]["name"] for r in gate.reviews]
        assert (0, 0) == (s.server.reviews_in_flight, s.server.body_bytes_in_flight)


# --- a retried review is judged once -------------------------------------------------------------


async def test_a_retried_review_is_judged_once() -> None:
    gate = Gate()
    gate.release.set()
    body = json.dumps(_review({"metadata": {"name": "p"}})).encode()
    async with serving({"quota": gate}) as s:
        first = await s.client.reply("/quota", body)
        second = await s.client.reply("/quota", body)
    assert 1 == len(gate.reviews)
    assert (200, 200) == (first.status, second.status)
    assert (
        first.body
        == second.body
        == {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "u-1", "allowed": True},
        }
    )


async def test_a_retry_while_the_review_is_judged_awaits_the_same_judgement() -> None:
    gate = Gate()
    body = json.dumps(_review({"metadata": {"name": "p"}})).encode()
    async with serving({"quota": gate}) as s:
        first = asyncio.create_task(s.client.reply("/quota", body))
        await asyncio.wait_for(gate.entered.wait(), PATIENCE_S)
        second = asyncio.create_task(s.client.reply("/quota", body))
        await _eventually(lambda: s.server.reviews_in_flight == 2, "the retry waiting")
        gate.release.set()
        replies = await asyncio.gather(first, second)
    assert 1 == len(gate.reviews)
    assert replies[0].body == replies[1].body
    assert {"uid": "u-1", "allowed": True} == replies[0].body["response"]


async def test_a_retry_after_the_connection_was_reset_gets_the_first_judgement() -> None:
    gate = Gate()
    body = json.dumps(_review({"metadata": {"name": "p"}})).encode()
    async with serving({"quota": gate}) as s:
        _, writer = await _tls(s)
        writer.write(_http_request("/quota", body))
        await asyncio.wait_for(gate.entered.wait(), PATIENCE_S)
        writer.transport.abort()  # the API server's attempt ends; it sends the review again
        retry = asyncio.create_task(s.client.reply("/quota", body))
        await _eventually(lambda: s.server.reviews_in_flight == 2, "the retry waiting")
        gate.release.set()
        reply = await retry
    assert 1 == len(gate.reviews)
    assert (200, {"uid": "u-1", "allowed": True}) == (reply.status, reply.body["response"])


async def test_the_same_uid_with_another_body_is_judged_on_its_own() -> None:
    gate = Gate()
    gate.release.set()
    async with serving({"quota": gate}) as s:
        for name in ("p", "q"):
            body = json.dumps(_review({"metadata": {"name": name}}, uid="u-same")).encode()
            assert 200 == (await s.client.reply("/quota", body)).status
    assert ["p", "q"] == [r["request"]["name"] for r in gate.reviews]


async def test_the_same_review_to_two_webhooks_is_judged_by_each() -> None:
    first, second = Gate(), Gate()
    first.release.set()
    second.release.set()
    body = json.dumps(_review({"metadata": {"name": "p"}})).encode()
    async with serving({"quota": first, "other": second}) as s:
        assert 200 == (await s.client.reply("/quota", body)).status
        assert 200 == (await s.client.reply("/other", body)).status
    assert (1, 1) == (len(first.reviews), len(second.reviews))


# --- on uvloop's event loop ----------------------------------------------------------------------
#
# Kopf's CLI runs its operator on uvloop's loop whenever uvloop is installed (``kopf[uvloop]``,
# or any package that brings it), and tally is run by ``kopf run``. uvloop's transports derive
# from no asyncio class, and it reads an accepted socket as soon as it hands it to its protocol,
# whatever ``connection_made`` paused: a TLS upgrade begun a turn later found the ClientHello
# read and gone, and every handshake timed out. So every test above that needs no fixture runs
# again on uvloop's loop. uvloop is not in tally's dependencies, nor in the environment the
# e2e tests run tally in (that would move every e2e test onto it): ``make unit``/``make test``
# install it apart, into ``.venv/uvloop`` (or the directory ``TALLY_TEST_UVLOOP`` names).

UVLOOP_DIR = Path(__file__).parents[3] / ".venv" / "uvloop"

_ON_UVLOOP = sorted(
    name
    for name, case in list(globals().items())
    if name.startswith("test_")
    and inspect.iscoroutinefunction(case)
    and not inspect.signature(case).parameters
)


def _uvloop() -> Any:
    where = os.environ.get("TALLY_TEST_UVLOOP") or str(UVLOOP_DIR)
    if not Path(where, "uvloop").is_dir():
        pytest.fail(f"no uvloop in {where}: `make unit` installs it there")
    sys.path.insert(0, where)
    try:
        return importlib.import_module("uvloop")
    finally:
        sys.path.remove(where)


def test_every_case_that_needs_no_fixture_runs_on_uvloop_too() -> None:
    # The list itself: a rename that made the cases take fixtures would empty it silently.
    assert len(_ON_UVLOOP) >= 20
    assert {
        "test_a_retried_review_is_judged_once",  # a review answered, through aiohttp's client
        "test_a_silent_connection_is_closed_after_the_keepalive",  # a raw TLS connection
        "test_a_handshake_that_never_comes_is_closed",
        "test_at_the_cap_a_connection_whose_request_head_arrived_is_not_the_one_closed",
        "test_a_stopped_server_refuses_connections_and_closes_handshakes",
    } <= set(_ON_UVLOOP)


@pytest.mark.parametrize("name", _ON_UVLOOP)
def test_on_uvloop(name: str) -> None:
    uvloop = _uvloop()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert "uvloop" in type(runner.get_loop()).__module__
        runner.run(globals()[name]())
