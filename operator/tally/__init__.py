"""tally: Kubernetes' ResourceQuota system and a ReplicaSet-like PodSet, as a Kopf operator.

Packages by layer, imports only going downward (``import-linter`` contracts in
``pyproject.toml``, checked by ``make lint``; ``docs/architecture.md`` draws them):

* :mod:`tally.app`: the Kopf wiring and the composition root, the only importer of ``kopf``;
* :mod:`tally.webhook`: serving admission and keeping the webhook configuration current;
* :mod:`tally.admission`, :mod:`tally.resourcequota`, :mod:`tally.podset`,
  :mod:`tally.builtin_quota`: the controllers and admission, independent of each other;
* :mod:`tally.kube`: the API adapters;
* the pure core, with no API client, HTTP library or pydantic: :mod:`tally.charges`,
  :mod:`tally.evaluators`, :mod:`tally.machinery`, and at the bottom :mod:`tally.quota` and
  :mod:`tally.workqueue` (which holds what every layer shares: the clock, the token bucket,
  the watched task).

This file defines nothing.
"""
