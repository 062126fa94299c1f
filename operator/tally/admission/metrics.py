"""What quota admission reports: the :class:`AdmissionMetrics` hooks and two implementations.

:class:`~tally.admission.evaluator.QuotaEvaluator` calls the hooks; the Prometheus adapter
(``tally.app.metrics``) implements them. :class:`NoopAdmissionMetrics` is the default and
:class:`CountingAdmissionMetrics` keeps plain counters for tests. :func:`result_label` names a
verdict as the ``result`` label spells it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tally.admission.errors import CONFLICT, FORBIDDEN, AdmissionDenied

__all__ = [
    "AdmissionMetrics",
    "CountingAdmissionMetrics",
    "NoopAdmissionMetrics",
    "result_label",
]


class AdmissionMetrics(Protocol):
    """Hooks for admission metrics; every method is called on the event loop and must not block.

    ``result`` is one of ``allowed``, ``ignored`` (nothing to check), ``forbidden`` (403),
    ``conflict`` (409) or ``error`` (500, including timeouts).
    """

    def request_finished(self, resource: str, result: str, seconds: float) -> None:
        """A call to ``evaluate`` ended; ``resource`` is ``str(GroupResource)``."""
        ...

    def batch_checked(self, size: int) -> None:
        """A pass checked ``size`` waiters of one lane together."""
        ...

    def write_conflicted(self) -> None:
        """A quota status write lost its compare-and-swap (409)."""
        ...

    def retried(self) -> None:
        """A pass re-read its quotas to retry failed writes."""
        ...

    def rejudged(self, count: int) -> None:
        """A pass put ``count`` refusals back into their lane: it gave back a charge they
        were judged against."""
        ...


class NoopAdmissionMetrics:
    """Records nothing (the default)."""

    def request_finished(self, resource: str, result: str, seconds: float) -> None:
        pass

    def batch_checked(self, size: int) -> None:
        pass

    def write_conflicted(self) -> None:
        pass

    def retried(self) -> None:
        pass

    def rejudged(self, count: int) -> None:
        pass


@dataclass
class CountingAdmissionMetrics:
    """Plain counters, for tests and for a Prometheus adapter to read."""

    requests: dict[tuple[str, str], int] = field(default_factory=dict)
    batch_sizes: list[int] = field(default_factory=list)
    conflicts: int = 0
    retries: int = 0
    rejudged_refusals: int = 0

    def request_finished(self, resource: str, result: str, seconds: float) -> None:
        key = (resource, result)
        self.requests[key] = self.requests.get(key, 0) + 1

    def batch_checked(self, size: int) -> None:
        self.batch_sizes.append(size)

    def write_conflicted(self) -> None:
        self.conflicts += 1

    def retried(self) -> None:
        self.retries += 1

    def rejudged(self, count: int) -> None:
        self.rejudged_refusals += count


_: type[AdmissionMetrics] = NoopAdmissionMetrics
_ = CountingAdmissionMetrics


def result_label(denied: AdmissionDenied | None) -> str:
    """The ``result`` label of a verdict: ``allowed`` (None), ``forbidden``, ``conflict`` or
    ``error``."""
    if denied is None:
        return "allowed"
    if denied.code == FORBIDDEN:
        return "forbidden"
    if denied.code == CONFLICT:
        return "conflict"
    return "error"
