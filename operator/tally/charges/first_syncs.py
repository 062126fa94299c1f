"""Quotas whose first status was written a moment ago: creations admitted before it may still
come.

Admission judges a request only against quotas whose status it knows (upstream skips a quota
without ``status.hard`` too), so a create admitted while a new quota awaits its first sync is
charged to nobody. That first sync counts the object only if the object reached the caches
first; if its creation event comes after the first status was written, a recalculation must
follow, or the quota stays short of it until the next full resync and admission admits past
the limit. The quota controllers mark each first write here and, on a creation they did not see
charged, recalculate a quota first written within ``window`` seconds (the charge confirmation
timeout: how long an admitted object may take to reach the caches). A status whose hard names
changed is marked too: admission charges the names of ``status.hard``, so a create judged by the
old names was not charged the new ones.

The same holds for a ClusterQuota whose selection of a namespace just changed (relabelled, created,
a new selector): a create admitted by a webhook that judged by the old selection was charged to
the ClusterQuotas that selected the namespace before, and the recalculation the change started
may have run before the object reached the caches. :class:`RecentKeys` is the structure both
use: keys noted within the last ``window`` seconds.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class RecentKeys(Generic[K]):
    """Keys noted within the last ``window`` seconds."""

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self._clock = clock
        self._at: OrderedDict[K, float] = OrderedDict()
        """Noted keys, the oldest first (an ordered dict: the oldest is dropped in constant
        time, where a plain dict's first entry is found past the holes its deletions left)."""

    def note(self, key: K) -> None:
        self._prune()
        self._at[key] = self._clock()
        self._at.move_to_end(key)  # re-noted: last, so that the order stays time order

    def recent(self, key: K) -> bool:
        """Whether ``key`` was noted within the window."""
        self._prune()
        return key in self._at

    def forget(self, key: K) -> None:
        self._at.pop(key, None)

    def __len__(self) -> int:
        self._prune()
        return len(self._at)

    def _prune(self) -> None:
        # Insertion order is time order: only the expired keys at the front are visited (every
        # key was copied at each call before, and a first pass noting 10 000 quotas within the
        # window spent 13 % of its time here).
        horizon = self._clock() - self.window
        at = self._at
        while at and next(iter(at.values())) <= horizon:
            at.popitem(last=False)


class FirstSyncs(RecentKeys[K]):
    """When each quota's first status (or one with other hard names) was written, for
    ``window`` seconds."""

    def wrote_first(self, key: K) -> None:
        self.note(key)
