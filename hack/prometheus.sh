#!/usr/bin/env bash
# Prometheus and promtool for the dashboard and alert tests (tests/e2e/test_observability.py),
# from Debian's `prometheus` package: a signed build from the distribution's mirror, so nothing
# is downloaded from an unpinned release page. Called by `make test`/`make e2e`; does nothing
# when both binaries are already on PATH. Fails loudly when they cannot be installed: the tests
# that need them must fail, never skip.
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    exit 0
fi

if ! command -v apt-get >/dev/null; then
    echo "hack/prometheus.sh: prometheus/promtool are not on PATH and apt-get is unavailable;" \
        "install Debian's (or your distribution's) prometheus package by hand" >&2
    exit 1
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
    sudo=(sudo)
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
# --no-install-recommends: the node exporter the package recommends is not needed here.
"${sudo[@]}" apt-get install -y -qq --no-install-recommends prometheus >/dev/null

for binary in prometheus promtool; do
    if ! command -v "$binary" >/dev/null; then
        echo "hack/prometheus.sh: installed Debian's prometheus package but $binary is not on PATH" >&2
        exit 1
    fi
done
