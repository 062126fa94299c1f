"""tally starts against the real control plane, reaches it, and answers its liveness probe."""

from __future__ import annotations

import json
import urllib.request

import cluster
from tally_e2e import RunningOperator


def test_liveness_reports_the_api_server_it_reached(operator: RunningOperator) -> None:
    with urllib.request.urlopen(operator.liveness_url, timeout=5) as response:
        assert response.status == 200
        probes = json.loads(response.read())
    # The start-up handler records the server's version; the control plane was built at the
    # version pinned in hack/k8s/go.mod, so anything else means tally talked to something else.
    assert probes["apiserver"] == cluster.kubernetes_version()
    assert operator.process.poll() is None
