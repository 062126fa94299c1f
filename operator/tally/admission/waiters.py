"""A request waiting for its verdict (upstream's ``admissionWaiter``), and its record in a pass.

:class:`~tally.admission.evaluator.QuotaEvaluator` queues one :class:`Waiter` per request in
the request's lane; a pass (``check_quotas``) checks every waiter of the lane together and
keeps what it did for each request on its waiter: whether its charge joined the running totals,
what it charges, its charge in the ledger, what the stored statuses hold of it, and its
refusal. The pass resets that record when it starts (:meth:`Waiter.begin_pass`): a refusal sent
back to the lane is judged afresh by the next pass.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tally.admission.attributes import resource_version
from tally.admission.checks import Quota, Request
from tally.admission.errors import AdmissionDenied
from tally.charges import Charge, ObjectRef
from tally.evaluators.base import Operation
from tally.quota.identity import QuotaIdentity
from tally.quota.resources import ResourceList

__all__ = ["Waiter"]


@dataclass(eq=False)
class Waiter:
    """One request waiting for its verdict, and what the pass checking it has done for it."""

    request: Request
    future: asyncio.Future[AdmissionDenied | None]
    """Resolved exactly once, with ``None`` (allowed) or the refusal; never with an exception,
    so a verdict nobody awaits any more (a timed-out caller) is not an unretrieved error."""
    abandoned: bool = False
    """Set when the caller stopped waiting; the worker then drops the waiter unchecked, or
    stops re-checking it."""
    rejudged: int = 0
    """How many times a refusal of this request was set aside for a later pass
    (:data:`~tally.admission.evaluator.REJUDGE_LIMIT`)."""
    requeued: bool = False
    """Put back into its lane by the pass now ending: that pass leaves it unresolved."""

    # -- the record of the current pass (reset by begin_pass)

    counted: bool = False
    """Its charges joined the pass's running totals (it was pending at some point)."""
    charging: list[tuple[Quota, ResourceList]] = field(default_factory=list)
    """What the pass's latest check added to each quota, as the running totals hold it."""
    charge: Charge | None = None
    """Its charge in the ledger: what it is reserving or has reserved in each quota's status
    (a waiter refused later may hold some)."""
    written: dict[QuotaIdentity, tuple[str, ResourceList]] = field(default_factory=dict)
    """What of its charge each quota's stored status holds, and that status's
    resourceVersion."""
    refusal: AdmissionDenied | None = None
    """The refusal the checks gave it, delivered when the pass ends."""

    def begin_pass(self) -> None:
        """Forget what an earlier pass recorded."""
        self.counted, self.charging, self.charge = False, [], None
        self.written, self.refusal = {}, None

    def resolve(self, verdict: AdmissionDenied | None) -> None:
        """Deliver ``verdict`` (``None``: allowed), unless a verdict was delivered already."""
        if not self.future.done():
            self.future.set_result(verdict)

    @property
    def namespace(self) -> str:
        return self.request.attributes.namespace

    @property
    def gave_back(self) -> bool:
        """Whether what was written for this request charges nothing: it was refused, or its
        caller stopped waiting (the API server has refused it)."""
        allowed = self.future.done() and self.future.result() is None
        return self.abandoned or not allowed

    def charged_object(self) -> tuple[ObjectRef, str, str]:
        """The object the charge waits for: its reference, uid, and (for an UPDATE) the
        resourceVersion the update replaces."""
        attributes = self.request.attributes
        metadata = (attributes.obj or {}).get("metadata") or {}
        ref = ObjectRef(
            attributes.group_resource,
            attributes.namespace,
            attributes.name or str(metadata.get("name") or ""),
        )
        replaces = (
            resource_version(attributes.old_obj) if attributes.operation == Operation.UPDATE else ""
        )
        return ref, str(metadata.get("uid") or ""), replaces
