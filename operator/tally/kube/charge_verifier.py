"""Asks the API whether the objects of charges past their deadline were stored.

The charge ledger (:mod:`tally.charges.ledger`) asks when a charge's object has not reached
tally's caches within ``TALLY_CHARGE_CONFIRM_TIMEOUT``; this adapter makes the request and
turns every outcome into an answer (:class:`~tally.charges.verification.Listed` or
:class:`~tally.charges.verification.Unanswered`), errors included: what an answer means, and
how often a charge may go unanswered, is :mod:`tally.charges.verification`'s.

**The question is a LIST**, of the object's namespace with ``fieldSelector=metadata.name=<name>``
(a field every resource, custom ones included, can be selected by), asking for the items'
metadata only (a Secret near 1 MiB answers a few hundred bytes). tally's ClusterRole grants
``list`` and ``watch`` on every kind it counts (its caches need them) and, on purpose, no
``get``: a GET would be refused, and a refusal is not a "stored". Without a resourceVersion the
LIST is a consistent read: a read of the API server's watch cache (``resourceVersion=0``) could
be as far behind as tally's own caches, which is what is in doubt. Its cost: API servers
without the consistent reads from cache (before 1.31) read the kind's objects in that
namespace from etcd and filter them; only charges past their deadline are asked about (creates
refused after tally's answer, or caches seconds behind), at most :data:`VERIFY_CONCURRENCY` at
once.

**Each question ends** within :data:`ANSWER_SHARE` of the confirmation timeout, the wait for
one of the concurrency slots included: the ledger asks again at the charge's next deadline, one
timeout after the question, so an answer later than that is of no use, and the rest of the
timeout is a margin for a busy event loop. A question that got no slot in that time was never
sent (:class:`~tally.charges.verification.Unasked`): no strike against its charge.

Owns the request, its time limit and concurrency, and reading the cache's entry for the name
when the answer comes (which tells a superseded update from one the caches have not reached);
leaves the decisions to :mod:`tally.charges.verification` and the ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Final

from kubernetes_asyncio import client

from tally.charges import (
    Answer,
    Charge,
    Listed,
    ObjectRef,
    ObjectVersion,
    Unanswered,
    Unasked,
)
from tally.evaluators.base import GroupResource
from tally.kube import rest
from tally.machinery.cache import Store

VERIFY_CONCURRENCY: Final = 10
"""Questions in flight at once: a burst's charges expire together, and each question is a LIST
the API server may have to read from etcd."""

ANSWER_SHARE: Final = 0.8
"""The share of the confirmation timeout a question may take (see the module doc)."""


class KubeChargeVerifier:
    """The ledger's :class:`~tally.charges.Verify`: one task per question, answered on the
    loop."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        timeout: float,
        version_of: Callable[[GroupResource], str | None],
        stores: Mapping[GroupResource, Store[Any]],
        concurrency: int = VERIFY_CONCURRENCY,
    ) -> None:
        """``api``: a client whose requests wait behind no one else's (a question stuck behind
        a burst of the controllers' requests would run out of time and release a charge whose
        object exists); this adapter bounds its own requests (``concurrency``). ``timeout``:
        the ledger's confirmation timeout. ``version_of``: the API version a kind is read at
        (None: no longer watched). ``stores``: tally's caches by kind."""
        self._api = api
        self._within = timeout * ANSWER_SHARE
        self._version_of = version_of
        self._stores = stores
        self._concurrency = concurrency
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    def verify(self, charges: list[Charge], answer: Callable[[Charge, Answer], None]) -> None:
        """Ask about each of ``charges``; give each answer to ``answer``."""
        loop = asyncio.get_running_loop()
        for charge in charges:
            task = loop.create_task(self._verify(charge, answer), name="charge-verification")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Cancel the questions in flight (their charges are left to the stopped ledger)."""
        tasks, self._tasks = self._tasks, set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _verify(self, charge: Charge, answer: Callable[[Charge, Answer], None]) -> None:
        # The ledger asks only about charges with an object; a hold has none to list.
        answer(charge, await self.ask(charge.ref) if charge.ref is not None else Listed(None))

    async def ask(self, ref: ObjectRef) -> Answer:
        """What the API holds under ``ref``'s namespace and name; never raises (but for
        cancellation): a failure is an :class:`Unanswered`."""
        gr = ref.group_resource
        version = self._version_of(gr)
        if version is None:
            # No quota counts the kind any more: nothing its charge holds is worth keeping.
            return Listed(None)
        path = rest.collection_path(gr.group, version, gr.resource, ref.namespace)
        query = [("fieldSelector", f"metadata.name={escape_field_value(ref.name)}")]
        deadline = asyncio.get_running_loop().time() + self._within
        try:
            async with asyncio.timeout_at(deadline):
                await self._slots.acquire()
        except TimeoutError:
            # tally's own backlog, not the API's: no strike against the charge.
            return Unasked(
                f"no slot within {self._within:g} s: {self._concurrency} question(s) in flight"
            )
        try:
            async with asyncio.timeout_at(deadline):
                page = await rest.get_json(self._api, path, query, accept=rest.METADATA_LIST)
        except client.ApiException as error:
            return Unanswered(error.status, str(error.reason or ""))
        except TimeoutError:
            return Unanswered(None, f"no answer within {self._within:g} s")
        except Exception as error:  # a connection error, an answer that is not JSON
            return Unanswered(None, f"{type(error).__name__}: {error}")
        finally:
            self._slots.release()
        return Listed(stored_version(page, ref.name), self._cached(ref))

    def _cached(self, ref: ObjectRef) -> ObjectVersion | None:
        store = self._stores.get(ref.group_resource)
        entry = store.entry(ref.namespace, ref.name) if store is not None else None
        return ObjectVersion(entry.uid, entry.resource_version) if entry is not None else None


def stored_version(page: Mapping[str, Any], name: str) -> ObjectVersion | None:
    """The uid and resourceVersion of the object named ``name`` in a LIST's answer; None when
    the answer holds none (the field selector leaves at most that one)."""
    items = page.get("items")
    for item in items if isinstance(items, list) else []:
        metadata = item.get("metadata") if isinstance(item, Mapping) else None
        if isinstance(metadata, Mapping) and metadata.get("name") == name:
            return ObjectVersion(
                str(metadata.get("uid") or ""), str(metadata.get("resourceVersion") or "")
            )
    return None


def escape_field_value(value: str) -> str:
    """``value`` as a field selector's value (apimachinery's ``fields.EscapeValue``): ``\\``,
    ``,`` and ``=`` escaped with a backslash."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
