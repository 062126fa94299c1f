"""tally's webhook against clients that are not the friendly API server.

* **Idle and slow clients.** 500 clients that open TLS connections and send nothing, and 50 that
  send a request head one byte a second, each opening a new connection soon after losing one
  (5 s, 1 s), for the whole test; meanwhile pods are created through the API server at a
  steady rate.
  Every create must be decided (allowed: the quota is generous) within the webhook's timeout,
  tally never holds more than its connection cap (``TALLY_WEBHOOK_MAX_CONNECTIONS``, 256) open,
  and its RSS grows by less than the cap's worth of TLS connections (``RSS_PER_CONNECTION`` each)
  plus ``RSS_SLACK``. The clients present the API server's own client certificate: with mutual
  TLS on (as here, and where the control plane can present one) nothing else completes a
  handshake at all (``test_webhook_mutual_tls.py``), so this is the worst case, or a cluster
  without mutual TLS.
* **A retried call.** The same review, byte for byte, sent twice (one after the other, and twice
  at once): it is judged and charged once, and both calls get the same answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import ssl
import statistics
import time
import urllib.parse
from pathlib import Path
from typing import Final

import pytest
from forged_reviews import post, review, webhook_url_and_ca
from kubernetes_asyncio import client

import builders
from tally.webhook.limits import HEADER_TIMEOUT_S, MAX_CONNECTIONS
from tally_e2e import RunningOperator, eventually

IDLE_CLIENTS: Final = 500
SLOW_CLIENTS: Final = 50
RECONNECT_S: Final = 5.0
"""An idle client's pause before it opens a new connection, once tally closed its last."""
SLOW_RECONNECT_S: Final = 1.0
CREATE_RATE: Final = 5.0
"""Pod creates a second through the API server while the clients press."""
PRESSURE_S: Final = 40.0
"""Long enough for several rounds of slow heads cut at the header timeout."""
RSS_PER_CONNECTION: Final = 300 * 1024
"""A TLS connection's cost in tally (asyncio's 256 KiB buffer and the rest; ~270 KiB
measured)."""
RSS_SLACK: Final = 48 * 1024 * 1024
"""The allocator keeping some of what closed connections freed, the creates' own work."""
DECIDED_WITHIN_S: Final = 10.0
"""The webhook's timeoutSeconds: a create not answered by then is refused by the API server."""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def held_connections(pid: int, local_port: int) -> int:
    """The connections tally holds on its webhook port: the fewest of three looks 10 ms apart.
    A connection accepted past the cap is closed at its first step on tally's event loop (before
    any TLS), but the kernel hands over a batch at a time, so a single look may catch a few
    accepted and not yet turned away."""
    counts = []
    for _ in range(3):
        counts.append(open_connections(pid, local_port))
        time.sleep(0.01)
    return min(counts)


def open_connections(pid: int, local_port: int) -> int:
    """TCP connections of process ``pid`` established on its ``local_port`` (by socket inode:
    the tables of /proc/<pid>/net list the whole network namespace)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and port == local_port and fields[9] in inodes:
                count += 1
    return count


class Pressure:
    """The idle and the slow clients, each reconnecting a second after losing its connection."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext) -> None:
        self.host, self.port, self.context = host, port, context
        self.opened = 0
        self.lost = 0
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for _ in range(IDLE_CLIENTS):
            self._tasks.append(asyncio.create_task(self._client(slow=False)))
        for _ in range(SLOW_CLIENTS):
            self._tasks.append(asyncio.create_task(self._client(slow=True)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _client(self, *, slow: bool) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection(
                    self.host, self.port, ssl=self.context, server_hostname=self.host
                )
            except (OSError, ssl.SSLError):
                await asyncio.sleep(SLOW_RECONNECT_S if slow else RECONNECT_S)
                continue
            self.opened += 1
            try:
                if slow:
                    writer.write(b"POST /quota HTTP/1.1\r\nHost: tally\r\nX-Slow: ")
                    while not reader.at_eof():
                        writer.write(b"x")
                        await writer.drain()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(1.0):
                                await reader.read(1024)
                else:
                    await reader.read()  # until tally closes it
            except (OSError, ssl.SSLError):
                pass
            finally:
                self.lost += 1
                writer.close()
            await asyncio.sleep(SLOW_RECONNECT_S if slow else RECONNECT_S)


pod = functools.partial(builders.pod, requests={"cpu": "1m"}, container_name="c")


async def _used(api: client.ApiClient, namespace: str) -> dict[str, str]:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota("q", namespace)
    return dict((quota.status and quota.status.used) or {})


@pytest.fixture
async def quota(api: client.ApiClient, namespace: str) -> str:
    await client.CoreV1Api(api).create_namespaced_resource_quota(
        namespace, builders.resource_quota("q", {"pods": "1000"})
    )
    await eventually(lambda: _used(api, namespace), until=lambda u: u == {"pods": "0"})
    return namespace


async def test_idle_and_slow_clients_do_not_keep_the_api_server_out(
    operator: RunningOperator, api: client.ApiClient, quota: str
) -> None:
    assert operator.webhook_client is not None
    url, ca_pem = await webhook_url_and_ca(api)
    target = urllib.parse.urlsplit(url)
    assert target.hostname is not None
    assert target.port is not None
    context = ssl.create_default_context(cadata=ca_pem)
    context.load_cert_chain(*operator.webhook_client)
    pid = operator.process.pid
    before = rss(pid)

    pressure = Pressure(target.hostname, target.port, context)
    pressure.start()
    core = client.CoreV1Api(api)
    latencies: list[float] = []
    peak_rss, peak_connections = before, 0
    loop = asyncio.get_running_loop()
    try:
        await asyncio.sleep(5.0)  # the clients are in
        started = loop.time()
        index = 0
        while loop.time() - started < PRESSURE_S:
            begun = loop.time()
            await core.create_namespaced_pod(quota, pod(f"p{index}"))
            latencies.append(loop.time() - begun)
            index += 1
            peak_rss = max(peak_rss, rss(pid))
            peak_connections = max(peak_connections, held_connections(pid, target.port))
            await asyncio.sleep(max(0.0, begun + 1 / CREATE_RATE - loop.time()))
        opened, lost = pressure.opened, pressure.lost
    finally:
        await pressure.stop()

    p50 = statistics.median(latencies)
    p99 = statistics.quantiles(latencies, n=100)[98]
    print(
        f"{len(latencies)} creates under {IDLE_CLIENTS} idle and {SLOW_CLIENTS} slow clients: "
        f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms; "
        f"tally RSS {before / 2**20:.0f} -> {peak_rss / 2**20:.0f} MiB, at most "
        f"{peak_connections} connections open; the clients opened {opened}, lost {lost}"
    )
    assert len(latencies) >= PRESSURE_S * CREATE_RATE * 0.8
    assert max(latencies) < DECIDED_WITHIN_S
    assert await _used(api, quota) == {"pods": str(len(latencies))}
    # Never past the cap; the clients were many more, so tally closed connections to keep it.
    assert peak_connections <= MAX_CONNECTIONS
    assert lost >= IDLE_CLIENTS + SLOW_CLIENTS - MAX_CONNECTIONS
    # Slow heads are cut at the header timeout: each slow client lost several connections.
    assert lost >= SLOW_CLIENTS * int(PRESSURE_S // (HEADER_TIMEOUT_S + SLOW_RECONNECT_S))
    assert peak_rss - before < MAX_CONNECTIONS * RSS_PER_CONNECTION + RSS_SLACK
    assert operator.process.poll() is None


async def test_a_retried_review_is_charged_once(
    operator: RunningOperator, api: client.ApiClient, quota: str
) -> None:
    assert operator.webhook_client is not None
    url, ca_pem = await webhook_url_and_ca(api)
    once = json.dumps(review(quota, pod("retried"), "pods", "Pod")).encode()
    twice = json.dumps(review(quota, pod("retried-at-once"), "pods", "Pod")).encode()

    first = await post(url, ca_pem, operator.webhook_client, once)
    again = await post(url, ca_pem, operator.webhook_client, once)
    together = await asyncio.gather(
        post(url, ca_pem, operator.webhook_client, twice),
        post(url, ca_pem, operator.webhook_client, twice),
    )
    assert first == again
    assert first["allowed"] is True
    assert together[0] == together[1]
    assert together[0]["allowed"] is True
    # Two objects, each charged once; no pod appears, so both are released afterwards.
    assert await _used(api, quota) == {"pods": "2"}
    await eventually(
        lambda: _used(api, quota), until=lambda u: u == {"pods": "0"}, within=30, what="release"
    )
    # A different review for the same name is another request: judged and charged on its own.
    other = await post(
        url, ca_pem, operator.webhook_client, review(quota, pod("retried"), "pods", "Pod")
    )
    assert other["allowed"] is True
    assert await _used(api, quota) == {"pods": "1"}
