"""PodSet (``podsets.tally.dev``): the ReplicaSet-like controller, its pure core and its client.

The controller (:mod:`tally.podset.controller`) is upstream's ReplicaSet controller in the
sample-controller shape: event handlers enqueue keys, workers sync from the caches, with
in-memory expectations; :mod:`tally.podset.client` is its API side (pod creates and deletes,
status writes, Events) and :mod:`tally.podset.validation` the PodSet webhook's checks. The rest
owns what ``pkg/controller/replicaset/`` and ``pkg/controller/controller_utils.go``
decide, written as plain functions and small classes over Kubernetes API JSON (``dict``, camelCase
keys, exactly as the API server sends them):

* :mod:`tally.podset.expectations`: which creates and deletes a PodSet still waits to observe
  (``ControllerExpectations``, ``UIDTrackingControllerExpectations``);
* :mod:`tally.podset.ranking`: which pods to delete first when scaling down;
* :mod:`tally.podset.claim`: which pods a PodSet keeps, adopts, releases or leaves alone, and the
  patch bodies that adopt or release them;
* :mod:`tally.podset.replicas`: slow-start batches, the burst cap and the pod built from the
  template;
* :mod:`tally.podset.status`: the status a sync computes, the ``ReplicaFailure`` condition, when
  to write it and when to look again for ``minReadySeconds``;
* :mod:`tally.podset.podutil`: small readers of pod JSON shared by the others (upstream
  ``pkg/api/v1/pod/util.go``).

Layering: everything but :mod:`tally.podset.client` is pure: it imports
no ``kopf``, ``kubernetes_asyncio`` or ``pydantic`` (a contract ``make lint`` checks). The
controller reads caches and calls the client through small protocols, and asks the other
modules what to do. The only coroutine is
:func:`tally.podset.replicas.slow_start_batch`, which runs calls it is given.

Left out on purpose: event handlers, the work queue loop, the API client, Kubernetes Events and
label-selector parsing (``tally.machinery.selectors``: functions here take a ``matches`` predicate).
"""
