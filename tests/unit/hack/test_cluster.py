"""hack/cluster.py's helpers that need no control plane."""

from __future__ import annotations

from pathlib import Path

import pytest

import cluster

pytestmark = pytest.mark.unit


def test_free_ports_are_never_handed_out_twice() -> None:
    # Each port is released before the next is asked for, as callers do (they bind later).
    ports = [cluster.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_the_front_proxy_has_a_ca_of_its_own(tmp_path: Path) -> None:
    """The aggregation layer's client certificate is signed by the front-proxy CA and by no
    other: an extension API server that trusts that CA then trusts the user headers of the
    API server's proxy only, never of the admin's certificate (the cluster CA's)."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    pki = cluster._write_pki(tmp_path)
    front_ca = x509.load_pem_x509_certificate(pki.front_proxy_ca.read_bytes())
    client = x509.load_pem_x509_certificate(pki.front_proxy_client_crt.read_bytes())
    cluster_ca = x509.load_pem_x509_certificate(pki.ca_crt.read_bytes())
    admin = x509.load_pem_x509_certificate(pki.admin_crt.read_bytes())

    names = client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert [n.value for n in names] == [cluster.FRONT_PROXY_CLIENT_NAME]
    client.verify_directly_issued_by(front_ca)
    usage = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(ValueError, match="subject does not match"):
        admin.verify_directly_issued_by(front_ca)
    with pytest.raises(ValueError, match="subject does not match"):
        client.verify_directly_issued_by(cluster_ca)
    assert front_ca.subject != cluster_ca.subject


def test_kwoks_configuration_keeps_its_other_defaults() -> None:
    """kwok reads a configuration file without defaulting it: an option left out is 0 or false,
    and a parallelism of 0 stops kwok at start ("node leases parallelism must be greater than
    0", seen). Every parallelism kwok v0.8.0 has is set, the pods' as asked, the others to
    kwok's defaults (``SetObjectDefaults_KwokConfiguration``), and the list pager kwok turns on
    by default stays on."""
    configuration = cluster.kwok_configuration(32)
    assert configuration["apiVersion"] == "config.kwok.x-k8s.io/v1alpha1"
    assert configuration["kind"] == "KwokConfiguration"
    options = configuration["options"]
    parallelisms = {name: value for name, value in options.items() if "Parallelism" in name}
    assert set(parallelisms) == {
        "podPlayStageParallelism", "nodePlayStageParallelism", "nodeLeaseParallelism",
        "podsOnNodeSyncParallelism",
    }  # fmt: skip
    assert parallelisms["podPlayStageParallelism"] == 32
    assert parallelisms["nodeLeaseParallelism"] == 4
    assert parallelisms["podsOnNodeSyncParallelism"] == 1
    assert options["enablePodsOnNodeSyncListPager"] is True


@pytest.mark.parametrize("parallelism", [0, -4])
def test_a_kwok_parallelism_below_one_is_refused_before_anything_starts(
    tmp_path: Path, parallelism: int
) -> None:
    with pytest.raises(cluster.ClusterError, match="1 or more"):
        cluster.up(tmp_path, "operator", nodes=1, kwok_pod_parallelism=parallelism)
    assert list(tmp_path.iterdir()) == []
