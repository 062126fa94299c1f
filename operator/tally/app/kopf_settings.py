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


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """Set ``settings`` (at start-up) for an operator whose only handlers are ``on.event``
    feeds, start-up, clean-up and probes."""
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
    settings.watching.chunk_size = 500
    settings.queueing.idle_timeout = 0.5
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Kopf logs every handler run at INFO; for caches fed by every pod event that is noise
    # (and cost). Failures still log at ERROR.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
