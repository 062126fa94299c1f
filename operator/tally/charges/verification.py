"""Whether a charge's object was stored, judged from what the API answered: pure decisions.

When a charge's deadline passes before its object reached tally's caches, the ledger asks the
API whether the object was stored (see :mod:`tally.charges.ledger`). The question is a LIST of
the object's namespace with ``fieldSelector=metadata.name=<name>``, which every resource
supports and which tally's ClusterRole already grants for every kind it counts (``list``, for
its caches); a GET would need a ``get`` rule that least privilege leaves out, and a refused
question must not be mistaken for "stored".

This module owns what an answer is (:class:`Listed`: the object of that name, or none, with
the cache's entry for the name when the answer came; :class:`Unanswered`: the API gave no
answer, with its HTTP status if it had one), what it means for the charge (:func:`decide`, a
:class:`Verdict`), how many unanswered questions in a row a charge may have
(:data:`MAX_UNANSWERED`) and the words of the log lines about them. It leaves out the request
(:mod:`tally.kube.charge_verifier`, which turns every outcome, errors included, into an
answer) and what the ledger does with a verdict (hold on, ask again, release).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

MAX_UNANSWERED: Final = 3
"""Questions about one charge that may go unanswered in a row (a timeout, a connection error, a
5xx, a 429) before it is released as unverified.

Each question has a whole confirmation timeout to answer (the adapter gives up at it), and the
next one is asked at the charge's next deadline, so with the default 5 s a charge is held at
most three timeouts (15 s) past its first deadline, plus the deadlines whose question tally
could not even send (:class:`Unasked`: its own questions held every slot, which says nothing
of the API; each question that holds a slot ends within its time, so the backlog moves on).
That rides out what usually makes the API fail for a moment (an API server restarting behind
its load balancer, an etcd leader election, priority and fairness shedding a burst: seconds),
while a charge for a create another webhook refused holds its quotas for seconds instead of
the 5-minute resync. Releasing a charge whose
object was stored after all costs less than holding one forever: the object, when the caches
see it, is counted late (``tally_admission_charges_late_total``) and its quotas are
recalculated at once."""

FORBIDDEN_STATUSES: Final = frozenset({401, 403})
"""The API refused tally the question itself: asking again will not help."""


@dataclass(frozen=True, slots=True)
class ObjectVersion:
    """One incarnation of an object at one write: its uid and resourceVersion."""

    uid: str
    resource_version: str


@dataclass(frozen=True, slots=True)
class Listed:
    """The API's answer: what it holds under the charge's namespace and name."""

    stored: ObjectVersion | None
    """The object of that name, None when there is none."""
    cached: ObjectVersion | None = None
    """tally's cache's entry for that name when the answer came (None: none), which tells an
    update that was superseded from one the caches have not reached yet."""


@dataclass(frozen=True, slots=True)
class Unanswered:
    """The question got no answer."""

    status: int | None
    """The HTTP status of the refusal; None without one (a timeout, a connection error, a
    response that is not a LIST)."""
    reason: str
    """What went wrong, for the log."""


@dataclass(frozen=True, slots=True)
class Unasked:
    """The question was never sent: tally's own questions in flight held every slot for the
    whole time it had. Says nothing of the API, so it is no strike against the charge."""

    reason: str


Answer = Listed | Unanswered | Unasked

STORED_WAIT_CAP: Final = 8
"""After a "stored" answer the next question about the charge waits ``timeout * 2**k`` (k:
stored answers in a row), at most this many timeouts.

A stored object is real: the charge is right to hold until the caches show it, and asking
again only guards against its deletion before they do (then the charge would hold usage until
asked again). Asking at every deadline cost one LIST per pending charge every timeout while the
caches lagged: at a cold start of 150 000 pods, with the caches minutes behind, thousands of
questions whose slots ran out and whose charges were then released unverified. With the
default 5 s timeout a stored object is asked about again after 10, 20, 40, 40, … s."""


def stored_wait(stored_answers: int, timeout: float) -> float:
    """How long after its ``stored_answers``-th stored answer in a row (≥ 1) a charge is
    asked about again."""
    factor: int = min(2**stored_answers, STORED_WAIT_CAP)
    return timeout * factor


class Verdict(enum.Enum):
    STORED = "stored"
    """The request's object exists: the caches are only behind. The charge is held on (asked
    about again at its next deadline)."""
    NOT_STORED = "not stored"
    """No object the request made: never stored (refused after tally's answer), deleted since,
    another incarnation of the name, or an update try another write superseded. Released as
    unconfirmed, its quotas recalculated."""
    FORBIDDEN = "forbidden"
    """The API refused tally the question (401, 403). Released as unverified at once."""
    UNANSWERED = "unanswered"
    """No answer this time: asked again at the next deadline, released as unverified after
    :data:`MAX_UNANSWERED` in a row."""
    UNASKED = "unasked"
    """The question was never sent (:class:`Unasked`): asked again at the next deadline, and
    not counted among the unanswered ones."""


def decide(uid: str, replaces: str, answer: Answer) -> Verdict:
    """What ``answer`` means for a charge of the object with ``uid`` ("": the review carried
    none) written by a CREATE (``replaces`` "") or by an UPDATE of the object at resourceVersion
    ``replaces``."""
    if isinstance(answer, Unasked):
        return Verdict.UNASKED
    if isinstance(answer, Unanswered):
        if answer.status in FORBIDDEN_STATUSES:
            return Verdict.FORBIDDEN
        if answer.status == 404:
            # A namespaced LIST answers an empty list for a namespace that does not exist; 404
            # is a kind the API no longer serves (its CRD deleted): nothing of it is stored.
            return Verdict.NOT_STORED
        return Verdict.UNANSWERED
    stored = answer.stored
    if stored is None or (uid and stored.uid != uid):
        return Verdict.NOT_STORED
    if not replaces:
        return Verdict.STORED
    # An update's try is stored, or superseded, once the object moved past the version it
    # replaced; the caches confirm the charge when they reach that version. If they hold that
    # version already, the try was superseded (the API server judged it, then tried again
    # against another write, and a later try or a refusal followed): given back.
    if stored.resource_version == replaces or answer.cached == stored:
        return Verdict.NOT_STORED
    return Verdict.STORED


def missing_right(resource: str) -> str:
    """The right the question needs on ``resource`` (``pods``, ``podsets.tally.dev``), as
    ``kubectl auth can-i`` spells it."""
    return f"list {resource}"


def describe_unanswered(resource: str, answer: Unanswered) -> str:
    """Why a question about an object of ``resource`` got no answer, for the log: a refusal
    names the right tally lacks."""
    if answer.status == 403:
        return f"403 {answer.reason}: tally's ServiceAccount needs {missing_right(resource)}"
    if answer.status == 401:
        return f"401 {answer.reason}: the API server does not accept tally's credentials"
    if answer.status is not None:
        return f"{answer.status} {answer.reason}"
    return answer.reason
