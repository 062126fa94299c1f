#!/usr/bin/env python3
"""kwok, the simulated kubelet, built from the upstream Go module pinned in ``hack/kwok/go.mod``.

``hack/cluster.py up --nodes N`` gives a control plane N simulated nodes: kube-scheduler binds
pods to them and the kwok controller (``sigs.k8s.io/kwok/cmd/kwok``) plays what a kubelet would
write, by the Stages in ``hack/kwok/stages.yaml``: nodes Ready (their Lease renewed), bound pods
Running and Ready, restartPolicy Never and Job pods Succeeded, deleted pods gone.

Built the way ``hack/helm.py`` builds Helm: ``hack/kwok/go.mod`` names the version (its ``tool
sigs.k8s.io/kwok/cmd/kwok`` line and the ``require`` line under it) and ``go.sum`` the hash of
every module the build reads. A separate Go module from ``hack/k8s``: kwok requires its own
versions of the Kubernetes client libraries, which must not move the control plane's pins (nor
the other way round). The binary is cached beside the control plane's, in
``<cache>/kwok-<version>-<digest of hack/kwok>/kwok``, built once and reused.

Used as a CLI (``python hack/kwok.py build|path|version``) and as a library by
``hack/cluster.py`` (``ensure_kwok()``, ``STAGES``). Standard library only, plus
``hack/cluster.py``'s build helpers.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import cluster

KWOK_MODULE_DIR = cluster.HACK_DIR / "kwok"
KWOK = "kwok"
KWOK_PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"
STAGES = KWOK_MODULE_DIR / "stages.yaml"
"""The Stages kwok plays (``--config``): upstream's node/fast, node/heartbeat-with-lease and
pod/fast, and pod-complete-never."""


def kwok_version() -> str:
    """The pinned kwok version (the ``sigs.k8s.io/kwok`` requirement in ``hack/kwok/go.mod``)."""
    path = KWOK_MODULE_DIR / "go.mod"
    match = re.search(r"^\s*(?:require\s+)?sigs\.k8s\.io/kwok\s+(v\S+)", path.read_text(), re.M)
    if not match:
        raise cluster.ClusterError(f"no sigs.k8s.io/kwok requirement in {path}")
    return match.group(1)


def kwok_dir(version: str | None = None) -> Path:
    """``<cache>/kwok-<version>-<inputs digest>``: one immutable directory per build input."""
    digest = cluster.build_inputs_digest(KWOK_MODULE_DIR)[:12]
    return cluster.cache_root() / f"kwok-{version or kwok_version()}-{digest}"


def kwok_present(version: str | None = None) -> bool:
    directory = kwok_dir(version)
    stamp = directory / ".inputs"
    return (
        os.access(directory / KWOK, os.X_OK)
        and stamp.exists()
        and stamp.read_text().strip() == cluster.build_inputs_digest(KWOK_MODULE_DIR)
    )


def build(*, force: bool = False) -> Path:
    """Build kwok into the cache unless it is there already; return the binary's path.

    Serialised by a lock file in its cache directory and written under a temporary name renamed
    on success (``cluster.go_build``), like the control plane.
    """
    version = kwok_version()
    directory = kwok_dir(version)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if kwok_present(version) and not force:
            return directory / KWOK
        go = cluster.go_toolchain()
        print(f"[kwok] building kwok {version} into {directory}", file=sys.stderr, flush=True)
        (directory / ".inputs").unlink(missing_ok=True)
        cluster.go_build(
            directory,
            KWOK,
            [go, "build", "-p", "2", "-trimpath", "-ldflags",
             f"-s -w -X sigs.k8s.io/kwok/pkg/consts.Version={version.lstrip('v')}",
             KWOK_PACKAGE],
            module_dir=KWOK_MODULE_DIR,
        )  # fmt: skip
        (directory / ".inputs").write_text(cluster.build_inputs_digest(KWOK_MODULE_DIR) + "\n")
        return directory / KWOK


def ensure_kwok() -> Path:
    """The cached kwok binary, built first if it is missing or its inputs changed."""
    if kwok_present():
        return kwok_dir() / KWOK
    return build()


def main(argv: Sequence[str] | None = None) -> int:
    return cluster.cached_tool_main(
        argv,
        prog="hack/kwok.py",
        description=__doc__.split("\n")[0],
        what="kwok",
        build=build,
        path=lambda: kwok_dir() / KWOK,
        extra={"version": ("print the pinned kwok version", kwok_version)},
    )


if __name__ == "__main__":
    sys.exit(main())
