"""Controller expectations: the creates and deletes a PodSet has asked for but not yet observed.

Upstream ``pkg/controller/controller_utils.go`` (``ControllerExpectations``,
``UIDTrackingControllerExpectations``). This module owns that bookkeeping and nothing else; the
PodSet controller decides when to set, lower and check it.

Design (after upstream's note above ``ExpKeyFunc``)
---------------------------------------------------

Expectations are a way for a controller to say what it is waiting for, e.g.::

    ControllerExpectations: {
        ns/podset1: expects  2 adds in 2 minutes
        ns/podset2: expects  2 dels in 2 minutes
        ns/podset3: expects -1 adds in 2 minutes => podset3's expectations have already been met
    }

Implementation:

    ControlleeExpectations = a pair of counters (add, del) and the time they were set
    ControllerExpectations = a dict from controller key to one ControlleeExpectations

Rules:

* Once set, expectations can only be lowered (an observed pod, or a call that failed and will
  therefore never be observed); setting them again replaces the record.
* A controller is not synced until its expectations are fulfilled (both counters ``<= 0``) or
  expire (:data:`EXPECTATIONS_TIMEOUT`).
* A controller that sets no expectations is woken up for every matching controllee.

Why this exists: the pod cache lags behind the API server. A sync that has just created 10 pods
does not see them in the cache yet; without expectations the next sync would create 10 more.

Concurrency: why there are no locks
-----------------------------------

Upstream guards the counters with atomics and the UID sets with a mutex, because informer
goroutines and workers run in parallel. tally runs every handler and worker on one asyncio
event loop, and every method here is synchronous: a method cannot be interleaved with another
task, because a task only yields at an ``await``. That is the whole replacement for the locks,
and it puts one rule on callers: **never ``await`` inside a critical section**, i.e. between
reading expectations and updating them as a consequence. In particular the controller must
record expectations (``expect_creations`` / ``expect_deletions``) *before* the first ``await``
on the create or delete calls, because pod events for the new pods are handled by other tasks
during that ``await`` and must find the record in place. Do not make these methods async.

Left out: ``ExpKeyFunc``/``UIDSetKeyFunc`` (plain dict keys), the error returns of the cache
store (a dict cannot fail), log levels, and a TTL store that purges records: as in upstream's
production store, an expired record stays until it is replaced or deleted, and only
``satisfied_expectations`` treats it as met.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable

logger = logging.getLogger(__name__)

EXPECTATIONS_TIMEOUT: float = 5 * 60.0
"""Seconds after which unmet expectations count as met (upstream ``ExpectationsTimeout``).

If a watch drops a delete event for a pod, it takes this long before a dormant controller
waiting for that event is woken up anyway. It is specifically targeted at the case where some
problem prevents an update of expectations; without it the controller could stay asleep forever.
It should be set from the expected latency of watch events. Upstream's derivation: a controller
can create *and* observe the watch events for about 10 pods a second, so servicing a full burst of
500 pods takes about a minute; creation alone is limited to 20 qps, and watch latency is 10-30 s
per pod at the scale of 3000 pods over 100 nodes. Five minutes covers that with margin.
"""

Clock = Callable[[], float]
"""Monotonic seconds; :func:`time.monotonic` in production, a fake in tests."""


@dataclasses.dataclass
class ControlleeExpectations:
    """What one controller still waits for (upstream ``ControlleeExpectations``)."""

    add: int
    """Creations still to observe; may go below zero (more observed than expected)."""
    delete: int
    """Deletions still to observe (upstream ``del``); may go below zero."""
    key: str
    """The controller's key, ``namespace/name``."""
    timestamp: float
    """Clock reading when the record was set; the TTL counts from here."""

    def fulfilled(self) -> bool:
        """Both counters are at or below zero."""
        return self.add <= 0 and self.delete <= 0

    def get_expectations(self) -> tuple[int, int]:
        """``(add, delete)``."""
        return self.add, self.delete


class ControllerExpectations:
    """Per-controller creation and deletion counters with a TTL (``ControllerExpectations``)."""

    def __init__(self, *, clock: Clock = time.monotonic, ttl: float = EXPECTATIONS_TIMEOUT) -> None:
        """``clock`` and ``ttl`` exist so tests can step time past the TTL."""
        self._clock = clock
        self._ttl = ttl
        # Invariant: every record is stored under its own key (record.key == dict key).
        self._store: dict[str, ControlleeExpectations] = {}

    def get_expectations(self, controller_key: str) -> ControlleeExpectations | None:
        """The live record (not a copy), or ``None`` if none was set or it was deleted."""
        return self._store.get(controller_key)

    def satisfied_expectations(self, controller_key: str) -> bool:
        """Whether the controller should sync: no record, fulfilled, or expired.

        When a new controller is created it has no expectations. When it does not see the
        expected watch events for longer than the TTL, they expire: it wakes up, creates or
        deletes controllees and sets expectations again. When it has met its expectations and has
        nothing to create or delete for longer than the TTL, they also expire, and it carries on
        without expectations until it next needs to create or delete.
        """
        exp = self._store.get(controller_key)
        if exp is None:
            return True
        if exp.fulfilled():
            return True
        if self._clock() - exp.timestamp > self._ttl:
            logger.debug("Controller expectations expired: %s", exp)
            return True
        logger.debug("Controller still waiting on expectations: %s", exp)
        return False

    def delete_expectations(self, controller_key: str) -> None:
        """Forget the controller's record (its object is gone: a new one starts clean)."""
        self._store.pop(controller_key, None)

    def set_expectations(self, controller_key: str, add: int, delete: int) -> None:
        """Replace the record with fresh counters, timestamped now."""
        exp = ControlleeExpectations(add, delete, controller_key, self._clock())
        logger.debug("Setting expectations: %s", exp)
        self._store[controller_key] = exp

    def expect_creations(self, controller_key: str, adds: int) -> None:
        """Expect ``adds`` creations and no deletions."""
        self.set_expectations(controller_key, adds, 0)

    def expect_deletions(self, controller_key: str, dels: int) -> None:
        """Expect ``dels`` deletions and no creations."""
        self.set_expectations(controller_key, 0, dels)

    def lower_expectations(self, controller_key: str, add: int, delete: int) -> None:
        """Subtract from the counters; a no-op without a record."""
        exp = self._store.get(controller_key)
        if exp is not None:
            exp.add -= add
            exp.delete -= delete
            logger.debug("Lowered expectations: %s", exp)

    def raise_expectations(self, controller_key: str, add: int, delete: int) -> None:
        """Add to the counters; a no-op without a record."""
        exp = self._store.get(controller_key)
        if exp is not None:
            exp.add += add
            exp.delete += delete
            logger.debug("Raised expectations: %s", exp)

    def creation_observed(self, controller_key: str) -> None:
        """One expected creation happened, or will never happen (its create call failed)."""
        self.lower_expectations(controller_key, 1, 0)

    def deletion_observed(self, controller_key: str) -> None:
        """One expected deletion happened, or will never happen (its delete call failed)."""
        self.lower_expectations(controller_key, 0, 1)


class UIDTrackingControllerExpectations:
    """:class:`ControllerExpectations` whose deletions are tracked by pod key.

    Upstream ``UIDTrackingControllerExpectations`` (it tracks ``namespace/name`` keys despite the
    name). This is needed over plain expectations to handle graceful deletion safely: the
    controller treats the update that sets a pod's ``deletionTimestamp`` as its delete, and then
    sees the real delete event later. Remembering which keys are expected means each pod lowers
    the count once, whichever of the two events comes first, and a deletion of a pod that was
    never expected (a user's ``kubectl delete``) lowers nothing.

    Creations are not tracked by UID (upstream's TODO, #22599): the UID is only known once the
    create call returns, so recording it would need a lock held *across* the create call, a
    bottleneck. Upstream's suggested fix is to generate the UID beforehand.

    Composition instead of a subclass, because ``expect_deletions`` and ``deletion_observed``
    take different arguments here than on :class:`ControllerExpectations`.
    """

    def __init__(self, expectations: ControllerExpectations | None = None) -> None:
        """Wrap ``expectations`` (a fresh :class:`ControllerExpectations` by default)."""
        self.expectations = expectations if expectations is not None else ControllerExpectations()
        """The counters this wraps (upstream embeds the interface)."""
        # Invariant: a key is in _uid_store[c] only while its deletion has been expected for c
        # and not yet observed; deletion_observed removes it when it lowers the counter, which
        # is what makes the graceful delete and the final delete count once.
        self._uid_store: dict[str, set[str]] = {}

    def get_uids(self, controller_key: str) -> frozenset[str] | None:
        """The pod keys whose deletion is still expected, or ``None`` if none were recorded."""
        keys = self._uid_store.get(controller_key)
        return frozenset(keys) if keys is not None else None

    def expect_deletions(self, controller_key: str, deleted_keys: Iterable[str]) -> None:
        """Expect the deletion of exactly these pod keys (duplicates count once).

        Replaces any earlier record, creations included, like the plain ``expect_deletions``.
        """
        expected = set(deleted_keys)
        existing = self._uid_store.get(controller_key)
        if existing:
            logger.error("Clobbering existing delete keys for %s: %s", controller_key, existing)
        logger.debug("Controller %s waiting on deletions for: %s", controller_key, expected)
        self._uid_store[controller_key] = expected
        self.expectations.expect_deletions(controller_key, len(expected))

    def deletion_observed(self, controller_key: str, delete_key: str) -> None:
        """Record that ``delete_key`` is deleted or being deleted; counts once per expected key."""
        keys = self._uid_store.get(controller_key)
        if keys is not None and delete_key in keys:
            logger.debug("Controller %s received delete for pod %s", controller_key, delete_key)
            self.expectations.deletion_observed(controller_key)
            keys.discard(delete_key)

    def delete_expectations(self, controller_key: str) -> None:
        """Forget both the counters and the expected keys."""
        self.expectations.delete_expectations(controller_key)
        self._uid_store.pop(controller_key, None)

    # The rest is the plain interface, unchanged.

    def get_expectations(self, controller_key: str) -> ControlleeExpectations | None:
        """See :meth:`ControllerExpectations.get_expectations`."""
        return self.expectations.get_expectations(controller_key)

    def satisfied_expectations(self, controller_key: str) -> bool:
        """See :meth:`ControllerExpectations.satisfied_expectations`."""
        return self.expectations.satisfied_expectations(controller_key)

    def set_expectations(self, controller_key: str, add: int, delete: int) -> None:
        """See :meth:`ControllerExpectations.set_expectations` (expected keys are kept)."""
        self.expectations.set_expectations(controller_key, add, delete)

    def expect_creations(self, controller_key: str, adds: int) -> None:
        """See :meth:`ControllerExpectations.expect_creations` (expected keys are kept)."""
        self.expectations.expect_creations(controller_key, adds)

    def creation_observed(self, controller_key: str) -> None:
        """See :meth:`ControllerExpectations.creation_observed`."""
        self.expectations.creation_observed(controller_key)

    def lower_expectations(self, controller_key: str, add: int, delete: int) -> None:
        """See :meth:`ControllerExpectations.lower_expectations`."""
        self.expectations.lower_expectations(controller_key, add, delete)

    def raise_expectations(self, controller_key: str, add: int, delete: int) -> None:
        """See :meth:`ControllerExpectations.raise_expectations`."""
        self.expectations.raise_expectations(controller_key, add, delete)
