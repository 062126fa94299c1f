"""How tally runs Kopf: its settings for watching only, shared with the benchmark that
measures what a Kopf pod watch costs by itself (``bench/admission.py --kopf-watch``)."""

from __future__ import annotations

import logging
from typing import Any

import kopf


class NoEssenceDiffBase(kopf.AnnotationsDiffBaseStorage):
    """Kopf's diff base, turned off: tally has no change handlers (create/update/resume/field).

    For every watch event Kopf builds the object's "essence" (a deep copy minus system
    fields) and diffs it against the last handled one, but only change handlers read that
    diff; on.event handlers do not. Measured under bench/admission.py, the deep copies were
    the largest single cost of a pod event in tally. ``fetch``/``build`` return None, for
    which Kopf skips the progress cleaning and computes an empty diff; ``store`` (called only
    after change handlers) refuses, so a change handler added later fails loudly instead of
    seeing no changes. ``tests/unit/app/test_handlers.py`` checks that none is registered.
    """

    def build(self, **_: Any) -> Any:
        return None

    def fetch(self, **_: Any) -> Any:
        return None

    def store(self, **_: Any) -> None:
        raise RuntimeError("tally registers no change handlers; Kopf's diff base is off")


LISTING_PAGE = 500
"""Objects per page of Kopf's initial listing where it is not streamed."""


def configure_kopf(settings: kopf.OperatorSettings, *, initial_streaming: bool) -> None:
    """Set ``settings`` (at start-up) for an operator whose only handlers are ``on.event``
    feeds, start-up, clean-up and probes. ``initial_streaming``: the API server streams a
    watch's initial state (:func:`tally.kube.rest.serves_watch_list`)."""
    # No Kopf peering: peering is not leader election (no lease, no fencing, and paused peers
    # would still serve webhooks). Which replica runs the controllers is tally's own Lease
    # (TALLY_LEADER_ELECTION, tally.machinery.leaderelection); Kopf watches on every replica.
    settings.peering.standalone = True
    # Kopf's own per-handler events would be posted onto objects tally does not own.
    settings.posting.enabled = False
    settings.persistence.diffbase_storage = NoEssenceDiffBase()
    # Memory at scale (bench/scale.py, 10 000 pods): Kopf's initial LIST in pages rather than
    # one response, and per-object workers that exit soon after their last event — an idle
    # worker holds that event's whole body for idle_timeout (5 s by default), so the initial
    # listing kept thousands of raw bodies alive at once.
    settings.watching.chunk_size = LISTING_PAGE
    settings.queueing.idle_timeout = 0.5
    # Kopf's listing of a kind is as slow as its events are handled, and a large cluster's takes
    # minutes (150 000 pods: ~200 000 events through Kopf at ~1 ms each). Paged, it fails once it
    # outlasts etcd's compaction (every 5 minutes by default): the next page's continue token is
    # refused with 410 Gone, which Kopf does not retry, and the watcher's failure stops the
    # whole operator, at every restart alike. Where the API server streams a watch's initial
    # state instead (WatchList), there is no token to expire. The pages stay for servers without
    # it; their pace is the same, so on those the limit stays.
    settings.watching.initial_streaming = initial_streaming
    # One watch request carries a kind's whole initial state when streamed: long enough for a
    # large cluster's (the server ends a watch at its timeout, and a stream cut before its end
    # resumes from an arbitrary object's resourceVersion). A dead connection is still noticed
    # within Kopf's inactivity timeout (70 s; the API server sends a bookmark every minute).
    settings.watching.server_timeout = 1800
    settings.watching.client_timeout = 1830
    # Kopf logs every handler run at INFO; for caches fed by every pod event that is noise
    # (and cost). Failures still log at ERROR.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
