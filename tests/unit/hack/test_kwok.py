"""hack/kwok.py and the simulated nodes of hack/cluster.py, without a control plane."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

import cluster
import kwok

pytestmark = pytest.mark.unit


def _stages() -> dict[str, dict[str, Any]]:
    documents = [d for d in yaml.safe_load_all(kwok.STAGES.read_text()) if d]
    assert all(d["kind"] == "Stage" for d in documents)
    return {d["metadata"]["name"]: d for d in documents}


def _selector(stage: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    return {
        e["key"]: (e["operator"], e.get("values", []))
        for e in stage["spec"]["selector"]["matchExpressions"]
    }


def test_the_stages_cover_a_node_and_a_pod_lifecycle() -> None:
    stages = _stages()
    assert sorted(stages) == [
        "node-heartbeat-with-lease",
        "node-initialize",
        "pod-complete",
        "pod-complete-never",
        "pod-delete",
        "pod-fail",
        "pod-ready",
    ]
    kinds = {name: stage["spec"]["resourceRef"]["kind"] for name, stage in stages.items()}
    assert {name for name, kind in kinds.items() if kind == "Node"} == {
        "node-initialize",
        "node-heartbeat-with-lease",
    }


def test_pod_complete_never_completes_running_restart_policy_never_pods() -> None:
    stage = _stages()["pod-complete-never"]
    assert _selector(stage) == {
        ".metadata.deletionTimestamp": ("DoesNotExist", []),
        ".status.phase": ("In", ["Running"]),
        ".spec.restartPolicy": ("In", ["Never"]),
        # A pod annotated to fail fails instead (pod-fail), never both at random.
        f'.metadata.annotations["{FAIL}"]': ("DoesNotExist", []),
    }
    assert "phase: Succeeded" in stage["spec"]["next"]["statusTemplate"]


FAIL = "pod-fail.stage.kwok.x-k8s.io/reason"


def test_pod_fail_fails_a_running_pod_annotated_so_whatever_its_restart_policy() -> None:
    stages = _stages()
    assert _selector(stages["pod-fail"]) == {
        f'.metadata.annotations["{FAIL}"]': ("Exists", []),
        ".metadata.deletionTimestamp": ("DoesNotExist", []),
        ".status.phase": ("In", ["Running"]),
    }
    assert "phase: Failed" in stages["pod-fail"]["spec"]["next"]["statusTemplate"]
    assert _selector(stages["pod-complete"])[f'.metadata.annotations["{FAIL}"]'] == (
        "DoesNotExist",
        [],
    )


def test_pod_delete_deletes_what_has_a_deletion_timestamp() -> None:
    stage = _stages()["pod-delete"]
    assert _selector(stage) == {".metadata.deletionTimestamp": ("Exists", [])}
    assert stage["spec"]["next"] == {"delete": True}


def test_a_fake_node_is_kwoks_and_untainted() -> None:
    node = cluster.fake_node("kwok-node-3")
    metadata: Any = node["metadata"]
    assert metadata["name"] == "kwok-node-3"
    # What kwok selects on (--manage-nodes-with-annotation-selector).
    assert metadata["annotations"] == {
        "kwok.x-k8s.io/node": "fake",
        "node.alpha.kubernetes.io/ttl": "0",
    }
    assert metadata["labels"]["type"] == "kwok"
    assert "spec" not in node


def test_the_pinned_kwok_version() -> None:
    assert kwok.kwok_version() == "v0.8.0"
