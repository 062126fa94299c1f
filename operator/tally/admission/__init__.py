"""ResourceQuota admission: the decisions of upstream's admission plugin, without the server.

The package is part of the controllers-and-admission layer and imports none of ``kopf``,
``kubernetes_asyncio``, ``aiohttp`` or ``pydantic``. Above it, tally's webhook server
(:mod:`tally.webhook.server`, its own aiohttp app) parses each AdmissionReview into an
:class:`Attributes` and, through the runtime's ``admit``, calls :meth:`QuotaEvaluator.evaluate`.

* ``attributes``: the request as admission sees it;
* ``errors``: :class:`AdmissionDenied`, the refusal with upstream's message and HTTP status;
* ``config``: upstream's ``ResourceQuotaConfiguration`` (LimitedResources);
* ``accessor``: the :class:`QuotaAccessor` protocol for reading quotas and writing status;
* ``checks``: ``checkRequest`` and phase 1 of ``checkQuotas``, pure;
* ``metrics``: the :class:`AdmissionMetrics` hooks, a no-op and a counting implementation;
* ``overcharges``: the charges written for requests then refused, which the next passes judge
  without;
* ``waiters``: a request waiting for its verdict, and what the pass checking it did for it;
* ``writes``: a pass's compare-and-swap status writes, and the fresh read of those that lost;
* ``evaluator``: :class:`QuotaEvaluator`, upstream's ``quotaEvaluator``: the queue of lanes (a
  lane: a namespace, or the namespaces ClusterQuotas select), the workers, and the pass
  (``checkQuotas``) with its retries.

This module only re-exports the names the rest of tally uses.
"""

from tally.admission.accessor import Conflict, NotFound, QuotaAccessor
from tally.admission.attributes import Attributes
from tally.admission.checks import check_request
from tally.admission.config import (
    Configuration,
    ConfigurationError,
    LimitedResource,
    parse_configuration,
)
from tally.admission.errors import AdmissionDenied
from tally.admission.evaluator import QuotaEvaluator
from tally.admission.metrics import (
    AdmissionMetrics,
    CountingAdmissionMetrics,
    NoopAdmissionMetrics,
)

__all__ = [
    "AdmissionDenied",
    "AdmissionMetrics",
    "Attributes",
    "Configuration",
    "ConfigurationError",
    "Conflict",
    "CountingAdmissionMetrics",
    "LimitedResource",
    "NoopAdmissionMetrics",
    "NotFound",
    "QuotaAccessor",
    "QuotaEvaluator",
    "check_request",
    "parse_configuration",
]
