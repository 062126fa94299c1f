#!/usr/bin/env python3
"""The floor webhook: the cheapest validating admission webhook, built from ``hack/floor``.

``hack/floor/main.go`` (standard library only) decodes each ``admission.k8s.io/v1``
AdmissionReview and allows it under the request's uid, over TLS, with mutual TLS when given a
client CA. ``bench/admission.py`` registers it on an operator-mode control plane without tally to
measure what a webhook costs when it does no admission work, the floor tally's cost is measured
against.

Built the way ``hack/helm.py`` builds Helm: into the control plane's cache (``hack/cluster.py``'s
``cache_root()``: ``~/.cache/tally/k8s`` or ``$TALLY_K8S_CACHE``), in
``<cache>/floor-<digest of hack/floor>/floor``, once per change of ``hack/floor`` (a few seconds:
the module has no requirements, so the build reads nothing from the Go module proxy).

Used as a CLI (``python hack/floor.py build|path``) and as a library (``ensure_floor()``).
Standard library only, plus ``hack/cluster.py``'s build helpers.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import cluster

FLOOR_MODULE_DIR = cluster.HACK_DIR / "floor"
FLOOR = "floor"


def floor_dir() -> Path:
    """``<cache>/floor-<inputs digest>``: one immutable directory per build input, keyed by the
    digest for the same reason as the control plane's (``cluster.bin_dir``)."""
    return cluster.cache_root() / f"floor-{cluster.build_inputs_digest(FLOOR_MODULE_DIR)[:12]}"


def floor_present() -> bool:
    directory = floor_dir()
    stamp = directory / ".inputs"
    return (
        os.access(directory / FLOOR, os.X_OK)
        and stamp.exists()
        and stamp.read_text().strip() == cluster.build_inputs_digest(FLOOR_MODULE_DIR)
    )


def build(*, force: bool = False) -> Path:
    """Build the floor webhook into the cache unless it is there already; the binary's path.

    Serialised by a lock file in its cache directory and written under a temporary name renamed
    on success (``cluster.go_build``), like the control plane.
    """
    directory = floor_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if floor_present() and not force:
            return directory / FLOOR
        go = cluster.go_toolchain()
        print(f"[floor] building the floor webhook into {directory}", file=sys.stderr, flush=True)
        (directory / ".inputs").unlink(missing_ok=True)
        cluster.go_build(
            directory,
            FLOOR,
            [go, "build", "-trimpath", "-ldflags", "-s -w", "."],
            module_dir=FLOOR_MODULE_DIR,
        )
        (directory / ".inputs").write_text(cluster.build_inputs_digest(FLOOR_MODULE_DIR) + "\n")
        return directory / FLOOR


def ensure_floor() -> Path:
    """The cached floor webhook, built first if it is missing or its inputs changed."""
    if floor_present():
        return floor_dir() / FLOOR
    return build()


def main(argv: Sequence[str] | None = None) -> int:
    return cluster.cached_tool_main(
        argv,
        prog="hack/floor.py",
        description=__doc__.split("\n")[0],
        what="the floor webhook",
        build=build,
        path=lambda: floor_dir() / FLOOR,
    )


if __name__ == "__main__":
    sys.exit(main())
