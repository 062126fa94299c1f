"""The quota side's keys: which running total, which share."""

from __future__ import annotations

import pytest

from tally.quota.identity import (
    QuotaIdentity,
    QuotaKey,
    cluster_quota_key,
    cluster_quota_of,
    format_key,
    quota_identity,
    quota_key,
    sync_key,
)

pytestmark = pytest.mark.unit

RQ = {"kind": "ResourceQuota", "metadata": {"namespace": "a", "name": "q"}}
CQ_VIEW = {"kind": "ClusterQuota", "metadata": {"namespace": "a", "name": "team"}}


def test_a_cluster_quota_read_in_two_namespaces_is_one_running_total() -> None:
    in_b = {"kind": "ClusterQuota", "metadata": {"namespace": "b", "name": "team"}}
    assert quota_identity(CQ_VIEW) == quota_identity(in_b) == ("ClusterQuota", "", "team")
    assert quota_identity(RQ) == QuotaIdentity("", "a", "q")


def test_a_resource_quota_of_the_same_name_is_another_total() -> None:
    same_name = {"metadata": {"namespace": "", "name": "team"}}
    assert quota_identity(same_name) != quota_identity(CQ_VIEW)
    assert quota_key(same_name) != cluster_quota_key("", "team")


def test_a_share_key_names_the_namespace_a_cluster_quota_is_charged_in() -> None:
    assert quota_key(RQ) == QuotaKey("a", "q")
    assert quota_key(RQ, "elsewhere") == ("a", "q")
    assert quota_key(CQ_VIEW, "b") == ("b", "clusterquota:team")
    assert cluster_quota_of(quota_key(CQ_VIEW, "b")) == "team"
    assert cluster_quota_of(QuotaKey("a", "q")) is None


def test_every_share_of_a_cluster_quota_syncs_as_the_whole() -> None:
    assert sync_key(cluster_quota_key("a", "team")) == ("", "clusterquota:team")
    assert sync_key(QuotaKey("a", "q")) == ("a", "q")


def test_keys_print_as_upstream_queue_keys() -> None:
    assert format_key(QuotaKey("a", "q")) == "a/q"
    assert format_key(cluster_quota_key("", "team")) == "clusterquota:team"


def test_missing_metadata_gives_empty_names_not_an_error() -> None:
    assert quota_identity({}) == ("", "", "")
    assert quota_key({"metadata": None}) == ("", "")
