"""tally's entry point under tracemalloc, for ``bench/memory.py``: ``kopf run`` loads this file,
which starts tracing, loads ``operator/main.py`` (registering tally's handlers as usual) and, on
SIGUSR1, writes a snapshot of the traced Python memory into ``$TALLY_BENCH_SNAPSHOTS``
(``snapshot-<n>.pickle``, then ``snapshot-<n>.done`` once it is complete).

Tracing slows tally down and costs memory of its own: the benchmark reads growth between
snapshots, never absolute sizes or latencies, from a process run this way.
"""

from __future__ import annotations

import gc
import os
import runpy
import signal
import tracemalloc
from pathlib import Path
from types import FrameType

FRAMES = 6
"""Frames kept per allocation: enough to tell whose call made it, cheap enough to run under."""

tracemalloc.start(FRAMES)
runpy.run_path(
    str(Path(__file__).resolve().parents[1] / "operator" / "main.py"),
    run_name="tally_operator_main",
)
_taken = 0


def _snapshot(signum: int, frame: FrameType | None) -> None:
    global _taken
    _taken += 1
    directory = Path(os.environ["TALLY_BENCH_SNAPSHOTS"])
    gc.collect()
    tracemalloc.take_snapshot().dump(str(directory / f"snapshot-{_taken}.pickle"))
    (directory / f"snapshot-{_taken}.done").touch()


signal.signal(signal.SIGUSR1, _snapshot)
