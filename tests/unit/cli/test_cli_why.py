"""tally.cli.why: what a create would charge each quota, and reading the server's refusal.

The charges follow upstream's CheckRequest (pkg/admission/plugin/resourcequota/controller.go):
the usage with zeros dropped, masked to each quota's hard names, added to its used and
compared with its hard; a quota applies only when every scope matches. Refusal messages are
upstream's (and tally's webhook's, which words them the same).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import builders
from tally.cli.main import registry
from tally.cli.why import (
    Charge,
    ManifestError,
    QuotaRef,
    explain,
    load_manifest,
    parse_denial,
)
from tally.clusterquota.quota import as_resource_quota
from tally.evaluators.base import GroupResource
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit

DENIED = 'admission webhook "quota.tally.dev" denied the request: '


def q(text: str) -> Quantity:
    return Quantity.parse(text)


# The pod a/p (its requests given) and quotas of namespace a.
pod = functools.partial(
    builders.pod, "p", namespace="a", image="x", resources="always", with_kind=True
)
quota = functools.partial(builders.resource_quota, namespace="a")


PODS = registry().get(GroupResource("", "pods"))


def why(obj: dict[str, Any], *refs: QuotaRef) -> Any:
    return explain(obj, "Pod", "a", PODS, refs)


def test_charges_each_quota_the_names_it_tracks() -> None:
    rq = quota("demo", {"pods": "5", "requests.cpu": "1"}, {"pods": "3", "requests.cpu": "300m"})
    explanation = why(pod({"cpu": "500m"}), QuotaRef("ResourceQuota", "demo", rq))
    assert {"count/pods": q("1"), "cpu": q("500m"), "pods": q("1"),
            "requests.cpu": q("500m")} == explanation.usage  # fmt: skip
    (verdict,) = explanation.quotas
    assert verdict.applies
    assert (
        Charge("pods", q("1"), q("3"), q("5")),
        Charge("requests.cpu", q("500m"), q("300m"), q("1")),
    ) == verdict.charges
    assert [q("4"), q("800m")] == [c.after for c in verdict.charges]
    assert verdict.fits
    assert explanation.fits


def test_over_the_limit_by_how_much() -> None:
    rq = quota("demo", {"requests.cpu": "1"}, {"requests.cpu": "300m"})
    (verdict,) = why(pod({"cpu": "900m"}), QuotaRef("ResourceQuota", "demo", rq)).quotas
    (charge,) = verdict.charges
    assert q("200m") == charge.over_by
    assert not verdict.fits


def test_a_cluster_quota_is_judged_on_its_total() -> None:
    cq = {
        "metadata": {"name": "team", "resourceVersion": "1"},
        "spec": {"namespaceSelector": {}, "quota": {"hard": {"pods": "4"}}},
        "status": {
            "total": {"hard": {"pods": "4"}, "used": {"pods": "4"}},
            "namespaces": [{"namespace": "b", "status": {"used": {"pods": "4"}}}],
        },
    }
    (verdict,) = why(
        pod({"cpu": "1"}), QuotaRef("ClusterQuota", "team", as_resource_quota(cq, "a"))
    ).quotas
    assert "ClusterQuota" == verdict.kind
    # a uses nothing itself; the total (b's 4 pods) is what the limit is on.
    assert (Charge("pods", q("1"), q("4"), q("4")),) == verdict.charges
    assert q("1") == verdict.charges[0].over_by


@pytest.mark.parametrize(
    ("obj", "scopes", "applies", "matched"),
    [
        pytest.param(pod({"cpu": "1"}), ["NotBestEffort"], True, [("NotBestEffort", True)],
                     id="burstable-in-not-best-effort"),
        pytest.param(pod(), ["NotBestEffort"], False, [("NotBestEffort", False)],
                     id="best-effort-outside-not-best-effort"),
        pytest.param(pod(), ["BestEffort", "NotTerminating"], True,
                     [("BestEffort", True), ("NotTerminating", True)], id="all-match"),
    ],
)  # fmt: skip
def test_a_quota_applies_only_when_every_scope_matches(
    obj: dict[str, Any], scopes: list[str], applies: bool, matched: list[tuple[str, bool]]
) -> None:
    rq = quota("scoped", {"pods": "5"}, {"pods": "0"}, scopes=scopes)
    (verdict,) = why(obj, QuotaRef("ResourceQuota", "scoped", rq)).quotas
    assert applies == verdict.applies
    assert matched == list(verdict.scopes)
    if not applies:
        assert "not in its scope" in verdict.not_applying
        assert verdict.fits


def test_a_constraint_refuses_a_pod_without_the_tracked_request() -> None:
    rq = quota("demo", {"pods": "5", "requests.cpu": "1"}, {"pods": "0", "requests.cpu": "0"})
    (verdict,) = why(pod(), QuotaRef("ResourceQuota", "demo", rq)).quotas
    # Upstream's words (pods_test.go TestPodEvaluatorConstraints).
    assert "must specify requests.cpu for: a" == verdict.failed
    assert not verdict.fits


def test_a_tracked_name_without_a_written_use_refuses() -> None:
    rq = quota("demo", {"pods": "5", "requests.cpu": "1"}, {"pods": "0"})
    (verdict,) = why(pod({"cpu": "1"}), QuotaRef("ResourceQuota", "demo", rq)).quotas
    assert ("requests.cpu",) == verdict.unknown
    assert not verdict.fits


def test_quotas_that_track_nothing_it_uses_are_left_out_and_new_ones_said_so() -> None:
    services = quota("svc", {"services": "1"}, {"services": "0"})
    new = quota("new", {"pods": "1"}, None)
    verdicts = why(
        pod({"cpu": "1"}),
        QuotaRef("ResourceQuota", "svc", services),
        QuotaRef("ResourceQuota", "new", new),
    ).quotas
    assert ["new"] == [v.name for v in verdicts]
    assert not verdicts[0].applies
    assert "status is not written yet" in verdicts[0].not_applying


def test_an_ignored_kind_and_an_unmeasurable_object() -> None:
    assert "Event is never quota-tracked" == explain({}, "Event", "a", None, ()).untracked
    broken = {"metadata": {"name": "p"}, "spec": {"containers": "no"}}
    explanation = why(broken)
    assert explanation.problem.startswith("cannot measure it: spec.containers")
    assert not explanation.fits


@pytest.mark.parametrize(
    ("message", "reason", "kind", "name", "over_by"),
    [
        pytest.param(
            DENIED + "exceeded quota: demo, requested: pods=1,requests.cpu=900m, "
            "used: pods=5,requests.cpu=300m, limited: pods=5,requests.cpu=1",
            "exceeded", "ResourceQuota", "demo", {"pods": q("1"), "requests.cpu": q("200m")},
            id="exceeded",
        ),
        pytest.param(
            DENIED + "exceeded cluster quota: team-a, requested: pods=1, used: pods=5, "
            "limited: pods=5",
            "exceeded", "ClusterQuota", "team-a", {"pods": q("1")}, id="exceeded-cluster",
        ),
        pytest.param(
            'pods "p" is forbidden: exceeded quota: q1, requested: requests.memory=2Gi, '
            "used: requests.memory=1Gi, limited: requests.memory=2Gi",
            "exceeded", "ResourceQuota", "q1", {"requests.memory": q("1Gi")},
            id="upstream-plugin",
        ),
        pytest.param(DENIED + "failed quota: demo: must specify requests.cpu for: a",
                     "failed", "ResourceQuota", "demo", {}, id="constraint"),
        pytest.param(DENIED + "failed cluster quota: t: must specify memory for: a",
                     "failed", "ClusterQuota", "t", {}, id="constraint-cluster"),
        pytest.param(DENIED + "status unknown for quota: demo, resources: pods",
                     "status unknown", "ResourceQuota", "demo", {}, id="status-unknown"),
        pytest.param('admission webhook "other.example" denied the request: no',
                     "", "", "", {}, id="not-a-quota"),
    ],
)  # fmt: skip
def test_parse_denial(
    message: str, reason: str, kind: str, name: str, over_by: dict[str, Quantity]
) -> None:
    denial = parse_denial(message)
    assert (reason, kind, name) == (denial.reason, denial.kind, denial.quota)
    assert over_by == denial.over_by
    assert message == denial.message


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param("a: [", "not YAML or JSON", id="not-yaml"),
        pytest.param("", "expected one object, found 0", id="empty"),
        pytest.param("kind: Pod\n---\nkind: Pod\n", "expected one object, found 2", id="two"),
        pytest.param("- a\n", "expected an object, found list", id="a-list"),
        pytest.param("kind: Pod\nmetadata: {name: p}\n", "no apiVersion", id="no-api-version"),
        pytest.param("apiVersion: v1\nkind: PodList\nitems: []\n", "give one object",
                     id="list-kind"),
        pytest.param("apiVersion: v1\nkind: Pod\n", "no metadata.name", id="no-name"),
    ],
)  # fmt: skip
def test_load_manifest_refuses(text: str, error: str) -> None:
    with pytest.raises(ManifestError, match=error):
        load_manifest(text, "pod.yaml")


def test_load_manifest_json_and_generate_name() -> None:
    obj = load_manifest('{"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "p-"}}',
                        "-")  # fmt: skip
    assert "Pod" == obj["kind"]
