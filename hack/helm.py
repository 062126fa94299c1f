#!/usr/bin/env python3
"""Helm, built from the upstream Go module at the version pinned in ``hack/helm/go.mod``.

The chart in ``charts/tally`` is linted and rendered by a real Helm, built the way
``hack/cluster.py`` builds the control plane: ``hack/helm/go.mod`` names the version (its
``tool helm.sh/helm/v3/cmd/helm`` line and the ``require`` line under it) and ``go.sum`` the
hash of every module the build reads, so the Go module proxy serves exactly what was pinned or
the build fails. The binary is cached outside the repository beside the control plane's, in
``<cache>/helm-<version>-<digest of hack/helm>/helm`` (``<cache>`` is ``hack/cluster.py``'s
``cache_root()``: ``~/.cache/tally/k8s`` or ``$TALLY_K8S_CACHE``), built once (5-8 minutes on
2 cores) and reused by every later run and fresh clone on the machine.

A separate Go module from ``hack/k8s``: Helm requires its own versions of the Kubernetes
client libraries, which must not move the control plane's pins (nor the other way round).

Used as a CLI (``python hack/helm.py build|path|version``) and as a library by the chart's
tests (``ensure_helm()``). Standard library only, plus ``hack/cluster.py``'s build helpers.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import cluster

HELM_MODULE_DIR = cluster.HACK_DIR / "helm"
HELM = "helm"
HELM_PACKAGE = "helm.sh/helm/v3/cmd/helm"


def _required_version(module: str) -> str:
    """The version ``hack/helm/go.mod`` requires of ``module``."""
    path = HELM_MODULE_DIR / "go.mod"
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", path.read_text(), re.M)
    if not match:
        raise cluster.ClusterError(f"no {module} requirement in {path}")
    return match.group(1)


def helm_version() -> str:
    """The pinned Helm version (the ``helm.sh/helm/v3`` requirement in ``hack/helm/go.mod``)."""
    return _required_version("helm.sh/helm/v3")


def helm_dir(version: str | None = None) -> Path:
    """``<cache>/helm-<version>-<inputs digest>``: one immutable directory per build input,
    keyed by the digest for the same reason as the control plane's (``cluster.bin_dir``)."""
    digest = cluster.build_inputs_digest(HELM_MODULE_DIR)[:12]
    return cluster.cache_root() / f"helm-{version or helm_version()}-{digest}"


def helm_present(version: str | None = None) -> bool:
    directory = helm_dir(version)
    stamp = directory / ".inputs"
    return (
        os.access(directory / HELM, os.X_OK)
        and stamp.exists()
        and stamp.read_text().strip() == cluster.build_inputs_digest(HELM_MODULE_DIR)
    )


def _ldflags(version: str) -> str:
    """What Helm's own Makefile passes for a release build.

    The version (``helm version``; without it a build says ``v3.22+unreleased``) and the
    Kubernetes version Helm assumes where it has no cluster to ask: ``helm template``'s
    ``.Capabilities.KubeVersion`` and ``helm lint``'s check for deprecated APIs. Helm's Makefile
    derives that from the ``k8s.io/client-go`` it is built with (v0.37.x -> 1.37).
    """
    client_go = _required_version("k8s.io/client-go").lstrip("v").split(".")
    major, minor = str(int(client_go[0]) + 1), client_go[1]
    flags = ["-s -w", f"-X helm.sh/helm/v3/internal/version.version={version}"]
    flags += [
        "-X helm.sh/helm/v3/internal/version.metadata=",
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean",
    ]
    for package in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {package}.k8sVersionMajor={major}", f"-X {package}.k8sVersionMinor={minor}"]
    return " ".join(flags)


def build(*, force: bool = False) -> Path:
    """Build Helm into the cache unless it is there already; return the binary's path.

    Serialised by a lock file in its cache directory (two test sessions never build it at once)
    and written under a temporary name renamed on success (``cluster.go_build``), like the
    control plane.
    """
    version = helm_version()
    directory = helm_dir(version)
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if helm_present(version) and not force:
            return directory / HELM
        go = cluster.go_toolchain()
        print(
            f"[helm] building Helm {version} into {directory} (first build: 5-8 min on 2 cores)",
            file=sys.stderr,
            flush=True,
        )
        (directory / ".inputs").unlink(missing_ok=True)
        cluster.go_build(
            directory,
            HELM,
            [go, "build", "-p", "2", "-trimpath", "-ldflags", _ldflags(version), HELM_PACKAGE],
            module_dir=HELM_MODULE_DIR,
        )
        (directory / ".inputs").write_text(cluster.build_inputs_digest(HELM_MODULE_DIR) + "\n")
        return directory / HELM


def ensure_helm() -> Path:
    """The cached Helm binary, built first if it is missing or its inputs changed."""
    if helm_present():
        return helm_dir() / HELM
    return build()


def main(argv: Sequence[str] | None = None) -> int:
    return cluster.cached_tool_main(
        argv,
        prog="hack/helm.py",
        description=__doc__.split("\n")[0],
        what="Helm",
        build=build,
        path=lambda: helm_dir() / HELM,
        extra={"version": ("print the pinned Helm version", helm_version)},
    )


if __name__ == "__main__":
    sys.exit(main())
