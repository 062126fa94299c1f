"""ResourceQuota admission: the decisions of upstream's admission plugin, without the server.

The package is part of the controllers-and-admission layer and imports none of ``kopf``,
``kubernetes_asyncio`` or ``pydantic``; the webhook adapter (Kopf handlers, TLS, webhook
configuration) sits above it and calls :meth:`QuotaEvaluator.evaluate` with an
:class:`Attributes` built from each AdmissionReview.

* ``attributes``: the request as admission sees it;
* ``errors``: :class:`AdmissionDenied`, the refusal with upstream's message and HTTP status;
* ``config``: upstream's ``ResourceQuotaConfiguration`` (LimitedResources);
* ``accessor``: the :class:`QuotaAccessor` protocol for reading quotas and writing status;
* ``checks``: ``checkRequest`` and phase 1 of ``checkQuotas``, pure;
* ``evaluator``: :class:`QuotaEvaluator`, the per-namespace batching, writes and retries.

This module only re-exports the names the adapter uses.
"""

from tally.admission.accessor import Conflict, QuotaAccessor
from tally.admission.attributes import Attributes
from tally.admission.checks import check_request
from tally.admission.config import (
    Configuration,
    ConfigurationError,
    LimitedResource,
    parse_configuration,
)
from tally.admission.errors import AdmissionDenied
from tally.admission.evaluator import (
    AdmissionMetrics,
    CountingAdmissionMetrics,
    NoopAdmissionMetrics,
    QuotaEvaluator,
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
    "QuotaAccessor",
    "QuotaEvaluator",
    "check_request",
    "parse_configuration",
]
