"""tally: Kubernetes' ResourceQuota system and a ReplicaSet-like PodSet, as a Kopf operator.

Layers, imports only going downward:

* pure core: quantities, resource lists, evaluators, work queue, expectations, caches. It
  imports none of ``kopf``, ``kubernetes_asyncio`` or ``pydantic`` and runs without a cluster;
* controllers and admission logic, driven from caches and a client passed in;
* thin Kopf wiring (``tally.handlers``, ``operator/main.py``).
"""
