"""hack/cluster.py's helpers that need no control plane."""

from __future__ import annotations

import pytest

import cluster

pytestmark = pytest.mark.unit


def test_free_ports_are_never_handed_out_twice() -> None:
    # Each port is released before the next is asked for, as callers do (they bind later).
    ports = [cluster.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
