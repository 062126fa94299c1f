"""tally with its PodSet controller's pod view lagging the API (a test harness; never deployed).

``kopf run tests/e2e/lagging_operator.py``: the operator of ``operator/main.py``, except that
every pod event reaches the PodSet controller's pod view ``TALLY_E2E_POD_EVENT_DELAY`` seconds
late (in order: equal delays fire in scheduling order), so its syncs run on a stale cache, as
they would behind a slow watch. The quota view is not delayed. Used by
``test_podset_robustness.py``: the expectations must keep the PodSet exact all the same.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from tally.app import handlers  # noqa: F401  (importing registers the handlers)
from tally.app.runtime import Runtime

DELAY_S = float(os.environ.get("TALLY_E2E_POD_EVENT_DELAY", "0"))

_build = Runtime.__init__


def _lagging(self: Runtime, *args: Any, **kwargs: Any) -> None:
    _build(self, *args, **kwargs)
    feed = self.pod_views.on_event

    def late(event_type: str | None, obj: Any) -> None:
        asyncio.get_running_loop().call_later(DELAY_S, feed, event_type, obj)

    self.pod_views.on_event = late  # type: ignore[method-assign]


Runtime.__init__ = _lagging  # type: ignore[method-assign]
