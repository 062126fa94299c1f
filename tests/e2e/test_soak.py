"""The soak (``bench/soak.py``) for two minutes, as CI runs it: churn over 50 namespaces on a
control plane of its own with two tally replicas behind a round-robin balancer, one fault of
every kind (a killed follower, a killed leader, a restarted API server, a paused etcd, the
webhook connections cut), and not one violation of the invariants the soak checks from the
objects themselves: nothing admitted past a quota, every status equal to the truth after each
quiet period, every PodSet at its replicas, every request decided outside the seconds around a
fault, no traceback in a replica's log outside them.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_soak() -> ModuleType:
    """``bench/soak.py`` (a script beside ``bench/_common.py``, not a package)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module("soak")


async def test_two_minutes_of_churn_and_every_fault_violate_nothing(tmp_path: Path) -> None:
    soak = load_soak()
    settings = soak.Settings(minutes=2, seed=17, out_dir=tmp_path, logs=tmp_path / "logs")
    result = await soak.soak(settings)
    print(json.dumps({k: result[k] for k in ("operations", "faults", "worst_convergence_s",
                                             "memory")}, indent=1))  # fmt: skip
    assert [] == result["violation_list"]
    assert all(result["faults"][kind] >= 1 for kind in soak.FAULT_KINDS), result["faults"]
    # Each cycle ended with a quiet period that converged, and the final one too.
    assert len(soak.FAULT_KINDS) + 1 == result["quiet_periods"]
    assert 0 == result["not_converged"]
    # Churn really ran: creates were admitted and, against full quotas, refused.
    assert result["outcomes"]["ok"] > 500, result["outcomes"]
    assert result["outcomes"]["denied"] > 50, result["outcomes"]
