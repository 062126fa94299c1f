"""How much the webhook server may hold and how long a peer may take: the numbers, the sizing
argument behind each default, and the count of reviews and body bytes held at once.

Owns :class:`WebhookLimits` (filled from the ``TALLY_WEBHOOK_…`` settings by the wiring) and
:class:`InFlight` (reviews and body bytes taken and given back by
:mod:`tally.webhook.server`). The connections themselves are :mod:`tally.webhook.connections`'
business, retried reviews :mod:`tally.webhook.answers`'.

**Memory.** About the most the webhook server holds at once, whatever its peers send::

    M  <=  C * 270 KiB  +  B * (2 + E)  +  A * 1 KiB

* ``C``: open connections (``max_connections``). An idle TLS connection costs about 270 KiB
  (measured: asyncio's TLS protocol allocates a 256 KiB read buffer per connection); one whose
  peer is sending holds up to ~0.7 MiB more for that moment (asyncio reads 256 KiB ahead into
  TLS, aiohttp 128 KiB ahead of the handler, and a head of at most 32 fields of 8 KiB);
* ``B``: body bytes of the reviews being read, parsed or judged (``body_budget_bytes``): each
  byte is held as read, once more as text while it is parsed, and as ``E`` bytes of parsed
  Python objects. ``E`` measured on CPython 3.11: about 1 for a Secret or ConfigMap (long
  strings), 6 for a pod, and at most 45 for any JSON (arrays nested in arrays: a list object
  per two bytes), which a custom resource can hold or a client that reaches the port forge;
* ``A``: answers kept for retried reviews (``answered_max``): the response as JSON and its key,
  under 1 KiB each.

With the defaults: 256 * 270 KiB = 68 MiB of connections; 16 MiB of bodies, which hold 48 MiB
as Secrets, 128 MiB as pods, 752 MiB at the worst; 4 MiB of answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Final

MIB: Final = 1024 * 1024

MAX_BODY_BYTES: Final = 7 * MIB
"""An UPDATE review carries ``object`` and ``oldObject``: each at most etcd's default request
limit (1.5 MiB, ``--max-request-bytes``) as stored, larger as JSON (an object stored as
protobuf, a Secret's bytes as base64, text with characters JSON escapes), plus the envelope.
controller-runtime's webhook server allows 7 MiB for the same reason
(``pkg/webhook/admission/http.go``, ``maxRequestSize``: two objects of at most 3 MB and 1 MB
for the rest)."""

BODY_BUDGET_BYTES: Final = 16 * MIB
"""Four of the largest UPDATE reviews the API server sends (two 1.5 MiB objects each, ~3.5 MiB
as JSON), or thousands of pod reviews, at once. At the worst expansion (45 bytes of objects a
byte, module docstring) the bodies hold 752 MiB, which with the connections still fits the
chart's 1 GiB memory limit beside tally's caches."""

MAX_REVIEWS_IN_FLIGHT: Final = 200
"""kube-apiserver's default ``--max-mutating-requests-inflight``: one API server with every
mutating request it admits at once waiting for tally is served without a 429."""

MAX_CONNECTIONS: Final = 256
"""Every review in flight (200) on a connection of its own (the API server's client speaks
HTTP/1.1 to webhooks), and room for the connections its pools keep idle (client-go keeps up to
25 per host): 256 * 270 KiB = 68 MiB."""

TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0
"""client-go's transport gives up on a handshake after 10 s (``TLSHandshakeTimeout`` in
``k8s.io/client-go/transport/cache.go``): a longer one serves nobody."""

HEADER_TIMEOUT_S: Final = 10.0
"""The API server gives up on a webhook call after its ``timeoutSeconds`` (10 s for tally's,
:mod:`tally.webhook.configuration`): a request head still arriving after that serves nobody."""

BODY_TIMEOUT_S: Final = 10.0
"""As for the head: the API server has given up by then."""

KEEPALIVE_TIMEOUT_S: Final = 120.0
"""Longer than the API server keeps an idle connection to a webhook, so that the API server
always closes first. Its webhook client (``k8s.io/apiserver/pkg/util/webhook/client.go``,
``rest.UnversionedRESTClientFor`` over HTTP/1.1) gets its transport from client-go's
``transport/cache.go``, which applies ``utilnet.SetTransportDefaults``
(``k8s.io/apimachinery/pkg/util/net/http.go``); its ``SetOldTransportDefaults`` sets
``IdleConnTimeout`` to ``http.DefaultTransport``'s, 90 s. A server that closed a pooled
connection first could do it just as the API server writes a review on it; Go's client does
not send a POST again once its bytes were written, and the request would be refused."""

ANSWERED_WINDOW_S: Final = 30.0
"""A retry of a webhook call happens within the call's timeout (``timeoutSeconds``, at most 30
s by the API's validation; 10 s for tally's), counted from the first attempt."""

ANSWERED_MAX: Final = 4096
"""At 136 reviews a second 4096 answers still span the window; at tally's measured peak (175
creates a second, ``bench/admission.py``) they span 23 s, past the 10 s timeout."""


@dataclasses.dataclass(frozen=True)
class WebhookLimits:
    """Bounds of :class:`tally.webhook.server.WebhookServer`; each default is argued at its
    constant in this module."""

    max_body_bytes: int = MAX_BODY_BYTES
    """Largest request body; past it: 413 naming the limit, nothing judged."""
    body_budget_bytes: int = BODY_BUDGET_BYTES
    """Body bytes of all reviews being read, parsed or judged at once; past it: 429."""
    max_reviews_in_flight: int = MAX_REVIEWS_IN_FLIGHT
    """Reviews being read, parsed or judged at once; past it: 429."""
    max_connections: int = MAX_CONNECTIONS
    """Open connections, handshakes included; past it the longest idle one is closed, or the
    new one when none is idle."""
    tls_handshake_timeout: float = TLS_HANDSHAKE_TIMEOUT_S
    """Seconds from a connection's accept to the end of its TLS handshake."""
    header_timeout: float = HEADER_TIMEOUT_S
    """Seconds from a request's first byte to the end of its head."""
    body_timeout: float = BODY_TIMEOUT_S
    """Seconds from the end of a request's head to the end of its body; also the bound on
    writing a response to a peer that does not read."""
    keepalive_timeout: float = KEEPALIVE_TIMEOUT_S
    """Seconds a connection may wait for a request's first byte (after its handshake, or after
    its previous response) before it is closed."""
    answered_window: float = ANSWERED_WINDOW_S
    """Seconds an answer is kept for a retry of the same review."""
    answered_max: int = ANSWERED_MAX
    """Answers kept at most; the oldest go first."""

    def __post_init__(self) -> None:
        if self.body_budget_bytes < self.max_body_bytes:
            # One body of the largest size must always fit, or it could never be read.
            raise ValueError(
                f"the body budget ({self.body_budget_bytes} bytes) is smaller than the "
                f"largest body ({self.max_body_bytes} bytes)"
            )
        if min(self.max_body_bytes, self.max_reviews_in_flight, self.max_connections) < 1:
            raise ValueError("body size, reviews in flight and connections must be positive")
        if self.answered_max < 0:
            raise ValueError("answered_max must not be negative")
        timeouts = (
            self.tls_handshake_timeout,
            self.header_timeout,
            self.body_timeout,
            self.keepalive_timeout,
        )
        if min(timeouts) <= 0:
            raise ValueError("timeouts must be positive")


class InFlight:
    """The reviews and body bytes the server holds at once, against their two limits.

    Taking never waits: a review that does not fit is answered at once (429), so a burst never
    piles up in tally's memory or makes the API server wait out its timeout."""

    def __init__(self, max_reviews: int, max_bytes: int) -> None:
        self.max_reviews: Final = max_reviews
        self.max_bytes: Final = max_bytes
        self.reviews = 0
        """Reviews entered and not yet left."""
        self.bytes = 0
        """Body bytes taken and not yet given back."""
        self._idle = asyncio.Event()
        """Set exactly while no review is in."""
        self._idle.set()

    def enter(self) -> bool:
        """One more review, if the limit allows it."""
        if self.reviews >= self.max_reviews:
            return False
        self.reviews += 1
        self._idle.clear()
        return True

    def leave(self) -> None:
        self.reviews -= 1
        if not self.reviews:
            self._idle.set()

    async def drained(self) -> None:
        """Until no review is in (at once when none is)."""
        await self._idle.wait()

    def take(self, size: int) -> bool:
        """``size`` more body bytes, if the budget allows them."""
        if self.bytes + size > self.max_bytes:
            return False
        self.bytes += size
        return True

    def give_back(self, size: int) -> None:
        self.bytes -= size
