"""Start-up detection of the cluster's own quota system (``tally.builtin_quota``).

tally replaces upstream's ResourceQuota admission plugin and resourcequota controller, so it
must not enforce beside them. Each test runs tally as a subprocess (``TallyProcess``) and looks
only at what can be seen from outside: its exit status, its log, the webhook configuration and
the probe quota in the API.

* **Reference mode** (upstream's quota system on, as on every managed cluster): tally starts and
  enforces ClusterQuotas only. It says so (naming both flags that would let it enforce
  ResourceQuotas too), its webhook has rules only for what ClusterQuotas name, upstream keeps
  enforcing ResourceQuotas with its own words, and tally writes nothing onto a ResourceQuota.
  It leaves no probe quota behind. With ``TALLY_ALLOW_BUILTIN_QUOTA=true`` it enforces both,
  with a warning.
* **Either part alone** (reference mode with the controller turned off, or with the admission
  plugin turned off; a control plane of its own, ~3 s to start): ClusterQuotas only, and the
  message names that part's flag only.
* **Operator mode**: tally starts, logs that the built-in system is off, and removes the probe
  (and a leftover probe a killed start would leave). Two replicas starting together both
  conclude: neither deletes the other's probe mid-run.
* **A dead webhook** in front of the probe namespace (what a killed tally can leave behind) is
  not taken for the built-in plugin: tally cannot tell, says so, and starts (fail-open).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from operator_process import OWN_NAMESPACE, TallyProcess

import cluster
from tally_e2e import ControlPlane

PROBE = "tally-builtin-quota-probe"
PROBE_SELECTOR = "app.kubernetes.io/component=builtin-quota-probe"
APISERVER_FLAG = "kube-apiserver --disable-admission-plugins=ResourceQuota"
CONTROLLER_MANAGER_FLAG = "kube-controller-manager --controllers=*,-resourcequota-controller"
PLUGIN_ON = (
    "kube-apiserver's ResourceQuota admission plugin: on (a dry-run create of a ResourceQuota "
    'was refused: "exceeded quota: tally-builtin-quota-probe, requested: resourcequotas=1, '
)
PLUGIN_OFF = "kube-apiserver's ResourceQuota admission plugin: off ("
CONTROLLER_ON = (
    "kube-controller-manager's resourcequota-controller: on (kube-controller-manager wrote the "
    "probe quota's status within "
)
CONTROLLER_OFF = "kube-controller-manager's resourcequota-controller: off ("
START_BOUND_S = 60.0
"""Python and Kopf start-up (~1 s), the probe (bounded by 10 s, ``TIMEOUT_S``; well under a
second against upstream), the LISTs and the webhook's registration."""
CRD = Path(__file__).resolve().parents[2] / "crds" / "clusterquotas.tally.dev.yaml"


def _tally(plane: ControlPlane, log: Path, **env: str) -> TallyProcess:
    """tally against ``plane``, with a webhook configuration name of its own (so that "none
    registered" is about this process only)."""
    name = f"tally-builtin-{uuid.uuid4().hex[:6]}.tally.dev"
    return TallyProcess(
        plane.kubeconfig,
        log,
        bin_dir=plane.bin_dir,
        env={"TALLY_WEBHOOK_CONFIG_NAME": name, **env},
    )


def _cluster_quotas_only(tally: TallyProcess) -> str:
    """Start ``tally``; return the log line that says it enforces ClusterQuotas only."""
    tally.start(timeout=START_BOUND_S)
    log = tally.log_text(tail=10_000)
    lines = [line for line in log.splitlines() if "tally enforces ClusterQuotas only" in line]
    assert len(lines) == 1, log
    (line,) = lines
    assert (
        "the cluster's built-in quota system is on: tally enforces ClusterQuotas only and "
        "leaves ResourceQuotas to it. "
    ) in line
    assert "For tally to enforce ResourceQuotas too, turn it off: " in line
    assert "failed permanently" not in log
    return line


def _metric(tally: TallyProcess, line_start: str) -> float:
    with urllib.request.urlopen(tally.metrics_url, timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(line_start):
                return float(line.split()[-1])
    raise AssertionError(f"no {line_start} in tally's metrics")


def _probe_quotas(plane: ControlPlane) -> list[str]:
    """Every probe quota in the cluster (by the probe's label, in any namespace)."""
    listed = plane.kubectl("get", "resourcequota", "-A", "-l", PROBE_SELECTOR, "-o", "name")
    return listed.stdout.split()


def _probe_took_ms(line: str) -> int:
    found = re.search(rf"\(Probe: quota [a-z0-9-]+/{PROBE}, (\d+) ms\.\)", line)
    assert found, line
    return int(found.group(1))


@contextlib.contextmanager
def _reference_tally(
    plane: ControlPlane, tmp_path: Path
) -> Iterator[tuple[TallyProcess, str, str]]:
    """tally against reference mode, the ClusterQuota CRD applied, and a namespace name and a
    team label to use (the namespace and a ClusterQuota named after the team, if made, are
    deleted afterwards, with tally's webhook configuration)."""
    plane.kubectl("apply", "-f", str(CRD))
    plane.kubectl(
        "wait", "--for=condition=Established", "crd/clusterquotas.tally.dev", "--timeout=60s"
    )
    tally = _tally(plane, tmp_path / "tally.log")
    namespace = f"e2e-builtin-{uuid.uuid4().hex[:6]}"
    team = f"builtin-{uuid.uuid4().hex[:6]}"
    try:
        yield tally, namespace, team
    finally:
        tally.kill()
        plane.kubectl("delete", tally.webhook_configuration, "--ignore-not-found", check=False)
        plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        plane.kubectl("delete", "clusterquota", team, "--ignore-not-found", check=False)


# -- reference mode: upstream's quota system is on


def test_reference_mode_enforces_cluster_quotas_only(
    reference_plane: ControlPlane, tmp_path: Path
) -> None:
    with _reference_tally(reference_plane, tmp_path) as (tally, namespace, team):
        line = _cluster_quotas_only(tally)
        assert PLUGIN_ON in line
        assert CONTROLLER_ON in line
        assert f"turn it off: {APISERVER_FLAG} " in line
        assert f" and {CONTROLLER_MANAGER_FLAG} " in line
        # The probe ran in tally's own namespace (TALLY_NAMESPACE, as the Deployment sets it),
        # which tally's webhook exempts.
        assert f"(Probe: quota {OWN_NAMESPACE}/{PROBE}, " in line
        print(f"probe against reference mode: {_probe_took_ms(line)} ms")
        assert [] == _probe_quotas(reference_plane)
        assert (0.0, 1.0) == (
            _metric(tally, 'tally_enforcing{kind="ResourceQuota"}'),
            _metric(tally, 'tally_enforcing{kind="ClusterQuota"}'),
        )
        # No ClusterQuota yet: tally's quota webhook has no rule at all.
        assert [] == _quota_rules(reference_plane, tally)
        reference_plane.kubectl("create", "namespace", namespace)
        reference_plane.kubectl("label", "namespace", namespace, f"team={team}")
        reference_plane.kubectl(
            "create", "quota", "q", "-n", namespace, "--hard=pods=5,configmaps=10"
        )
        reference_plane.kubectl(
            "apply", "-f", "-",
            input=json.dumps({
                "apiVersion": "tally.dev/v1alpha1", "kind": "ClusterQuota",
                "metadata": {"name": team},
                "spec": {"namespaceSelector": {"matchLabels": {"team": team}},
                         "quota": {"hard": {"pods": "2"}}},
            }),
        )  # fmt: skip
        _until(lambda: _cq_used(reference_plane, team) == {"pods": "0"}, "the first status")
        # The rules follow what ClusterQuotas name: pods (created and updated) and their resize
        # (updated only), nothing else.
        assert [(["pods"], ["CREATE", "UPDATE"]), (["pods/resize"], ["UPDATE"])] == [
            (r["resources"], r["operations"]) for r in _quota_rules(reference_plane, tally)
        ]
        _until(lambda: _service_account(reference_plane, namespace), "the default SA")
        for name in ("a", "b"):
            reference_plane.kubectl("run", name, "-n", namespace, "--image=registry.example/a:1")
        refused = reference_plane.kubectl(
            "run", "c", "-n", namespace, "--image=registry.example/a:1", check=False
        )
        assert refused.returncode != 0
        assert (
            f"exceeded cluster quota: {team}, requested: pods=1, used: pods=2, limited: pods=2"
        ) in refused.stderr
        # Upstream still enforces the ResourceQuota, with its own words (not a webhook's).
        # configmaps=10: kube-root-ca.crt (kube-controller-manager makes it) and nine more.
        _until(lambda: _has_root_ca(reference_plane, namespace), "kube-root-ca.crt")
        for index in range(9):
            reference_plane.kubectl("create", "configmap", f"m{index}", "-n", namespace)
        upstream = reference_plane.kubectl(
            "create", "configmap", "one-too-many", "-n", namespace, check=False
        )
        assert upstream.returncode != 0
        assert 'configmaps "one-too-many" is forbidden: exceeded quota: q' in upstream.stderr
        assert "admission webhook" not in upstream.stderr
        # tally wrote nothing onto the ResourceQuota.
        quota = json.loads(
            reference_plane.kubectl(
                "get", "quota", "q", "-n", namespace, "-o", "json", "--show-managed-fields"
            ).stdout
        )
        managers = {entry["manager"] for entry in quota["metadata"].get("managedFields", [])}
        assert "tally" not in managers, managers
        assert "kube-controller-manager" in managers, managers


def test_reference_mode_refuses_what_a_resource_quota_will_refuse_before_charging(
    reference_plane: ControlPlane, tmp_path: Path
) -> None:
    # Upstream's ResourceQuota plugin runs after the validating webhooks: a create it refuses
    # would already be charged to the ClusterQuota. tally judges the namespace's
    # ResourceQuotas first (upstream's status.used, tally's evaluators; never written) and
    # refuses in upstream's words, so nothing is charged that must be given back.
    with _reference_tally(reference_plane, tmp_path) as (tally, namespace, team):
        _cluster_quotas_only(tally)
        reference_plane.kubectl("create", "namespace", namespace)
        reference_plane.kubectl("label", "namespace", namespace, f"team={team}")
        reference_plane.kubectl("create", "quota", "q", "-n", namespace, "--hard=pods=1")
        reference_plane.kubectl(
            "apply", "-f", "-",
            input=json.dumps({
                "apiVersion": "tally.dev/v1alpha1", "kind": "ClusterQuota",
                "metadata": {"name": team},
                "spec": {"namespaceSelector": {"matchLabels": {"team": team}},
                         "quota": {"hard": {"pods": "10"}}},
            }),
        )  # fmt: skip
        _until(lambda: _cq_used(reference_plane, team) == {"pods": "0"}, "the first status")
        _until(lambda: _quota_used(reference_plane, namespace) == {"pods": "0"}, "upstream's")
        _until(lambda: _service_account(reference_plane, namespace), "the default SA")
        reference_plane.kubectl("run", "a", "-n", namespace, "--image=registry.example/a:1")
        _until(lambda: _cq_used(reference_plane, team) == {"pods": "1"}, "a charged")
        _until(lambda: _quota_used(reference_plane, namespace) == {"pods": "1"}, "a counted")
        before = _cq_version(reference_plane, team)
        refused = reference_plane.kubectl(
            "run", "b", "-n", namespace, "--image=registry.example/a:1", check=False
        )
        assert refused.returncode != 0
        assert (
            'admission webhook "quota.tally.dev" denied the request: exceeded quota: q, '
            "requested: pods=1, used: pods=1, limited: pods=1"
        ) in refused.stderr
        # Nothing was charged, so nothing is given back: the ClusterQuota is not written.
        time.sleep(1.0)
        assert before == _cq_version(reference_plane, team)
        assert 0.0 == tally.metric_sum("tally_admission_charges_released_total")


def _quota_used(plane: ControlPlane, namespace: str) -> dict[str, str]:
    answer = plane.kubectl("get", "quota", "q", "-n", namespace, "-o", "json", check=False)
    if answer.returncode != 0:
        return {}
    return dict((json.loads(answer.stdout).get("status") or {}).get("used") or {})


def _cq_version(plane: ControlPlane, name: str) -> str:
    answer = plane.kubectl("get", "clusterquota", name, "-o", "json")
    return str(json.loads(answer.stdout)["metadata"]["resourceVersion"])


def _quota_rules(plane: ControlPlane, tally: TallyProcess) -> list[dict[str, object]]:
    config = json.loads(plane.kubectl("get", tally.webhook_configuration, "-o", "json").stdout)
    (quota,) = [w for w in config["webhooks"] if w["name"] == "quota.tally.dev"]
    return list(quota.get("rules") or [])


def _cq_used(plane: ControlPlane, name: str) -> dict[str, str]:
    answer = plane.kubectl("get", "clusterquota", name, "-o", "json", check=False)
    if answer.returncode != 0:
        return {}
    return dict(
        ((json.loads(answer.stdout).get("status") or {}).get("total") or {}).get("used") or {}
    )


def _service_account(plane: ControlPlane, namespace: str) -> bool:
    return (
        plane.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode
        == 0
    )


def _has_root_ca(plane: ControlPlane, namespace: str) -> bool:
    found = plane.kubectl("get", "configmap", "kube-root-ca.crt", "-n", namespace, check=False)
    return found.returncode == 0


def _until(done: Callable[[], bool], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_the_override_starts_tally_beside_it(reference_plane: ControlPlane, tmp_path: Path) -> None:
    tally = _tally(reference_plane, tmp_path / "tally.log", TALLY_ALLOW_BUILTIN_QUOTA="true")
    try:
        tally.start()
        assert tally.webhook_serving()
        log = tally.log_text(tail=10_000)
    finally:
        tally.kill()
        reference_plane.kubectl(
            "delete", tally.webhook_configuration, "--ignore-not-found", check=False
        )
    warnings = [line for line in log.splitlines() if "tally enforces quotas beside it" in line]
    assert len(warnings) == 1, log
    (warning,) = warnings
    assert "[WARNING ]" in warning
    assert "because TALLY_ALLOW_BUILTIN_QUOTA=true" in warning
    assert PLUGIN_ON in warning
    assert CONTROLLER_ON in warning
    assert "failed permanently" not in log
    assert [] == _probe_quotas(reference_plane)


# -- either part alone


@pytest.fixture
def partial_plane(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ControlPlane]:
    """Reference mode with one part of upstream's quota system turned off by its flag (the
    extra arguments come last, and the first entry naming a controller wins)."""
    apiserver_args, controller_manager_args = request.param
    directory = tmp_path / "plane"
    try:
        state = cluster.up(
            directory,
            "reference",
            extra_apiserver_args=apiserver_args,
            extra_controller_manager_args=controller_manager_args,
        )
        yield ControlPlane(Path(state.kubeconfig), "reference", Path(state.bin_dir))
    finally:
        cluster.down(directory, clean=True, quiet=True)


@pytest.mark.parametrize(
    ("partial_plane", "seen", "flag", "not_named"),
    [
        pytest.param(
            ((), ("--controllers=*,-resourcequota-controller",)),
            (PLUGIN_ON, CONTROLLER_OFF), APISERVER_FLAG, CONTROLLER_MANAGER_FLAG,
            id="admission-plugin-only",
        ),
        pytest.param(
            (("--disable-admission-plugins=ResourceQuota",), ()),
            (PLUGIN_OFF, CONTROLLER_ON), CONTROLLER_MANAGER_FLAG, APISERVER_FLAG,
            id="controller-only",
        ),
    ],
    indirect=["partial_plane"],
)  # fmt: skip
def test_either_part_alone_leaves_resource_quotas_to_it(
    partial_plane: ControlPlane,
    seen: tuple[str, str],
    flag: str,
    not_named: str,
    tmp_path: Path,
) -> None:
    tally = _tally(partial_plane, tmp_path / "tally.log")
    try:
        line = _cluster_quotas_only(tally)
    finally:
        tally.kill()
        partial_plane.kubectl(
            "delete", tally.webhook_configuration, "--ignore-not-found", check=False
        )
    for words in seen:
        assert words in line
    assert f"turn it off: {flag} " in line
    assert not_named not in line
    assert [] == _probe_quotas(partial_plane)


# -- operator mode: upstream's quota system is off


def test_operator_mode_starts_and_leaves_no_probe_behind(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    # A leftover probe, as a start killed mid-probe would leave it: removed and replaced.
    own = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OWN_NAMESPACE}}
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(own))
    leftover = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": PROBE,
            "namespace": OWN_NAMESPACE,
            "labels": {"app.kubernetes.io/component": "builtin-quota-probe"},
        },
        "spec": {"hard": {"resourcequotas": "0"}},
    }
    control_plane.kubectl("create", "-f", "-", input=json.dumps(leftover))
    assert [f"resourcequota/{PROBE}"] == _probe_quotas(control_plane)
    tally = _tally(control_plane, tmp_path / "tally.log")
    try:
        tally.start()
        log = tally.log_text(tail=10_000)
    finally:
        tally.kill()
    lines = [line for line in log.splitlines() if "built-in quota system is off" in line]
    assert len(lines) == 1, log
    (line,) = lines
    assert "[INFO    ]" in line
    assert PLUGIN_OFF + "a dry-run create of a ResourceQuota was admitted" in line
    assert CONTROLLER_OFF + "nobody but tally wrote the probe quota's status" in line
    print(f"probe against operator mode: {_probe_took_ms(line)} ms")
    assert [] == _probe_quotas(control_plane)


def test_replicas_starting_together_both_conclude(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    # Two replicas of a Deployment start at the same moment and probe in the same namespace:
    # neither deletes the other's probe mid-run (one waits for the other's to go), so both
    # can tell, and no probe is left behind.
    namespace = f"bq-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", namespace)
    replicas = [
        _tally(control_plane, tmp_path / f"tally-{n}.log", TALLY_NAMESPACE=namespace)
        for n in range(2)
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(replica.start) for replica in replicas]:
                started.result()
        logs = [replica.log_text(tail=10_000) for replica in replicas]
    finally:
        for replica in replicas:
            replica.kill()
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    for log in logs:
        lines = [line for line in log.splitlines() if "built-in quota system is off" in line]
        assert len(lines) == 1, log
        assert f"(Probe: quota {namespace}/{PROBE}, " in lines[0]
        assert "could not tell whether" not in log
        assert "deleting a leftover" not in log
    assert [] == _probe_quotas(control_plane)


def test_a_dead_webhook_is_not_taken_for_the_builtin_plugin(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    # A fail-closed configuration whose server is gone, named and worded like tally's, in front
    # of the namespace the probe uses (TALLY_NAMESPACE).
    namespace = f"bq-{uuid.uuid4().hex[:6]}"
    dead = f"tally-dead-{uuid.uuid4().hex[:6]}.tally.dev"
    configuration = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": dead},
        "webhooks": [
            {
                "name": "quota.tally.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "NoneOnDryRun",
                "failurePolicy": "Fail",
                "timeoutSeconds": 2,
                "clientConfig": {"url": f"https://127.0.0.1:{cluster.free_port()}/quota"},
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["resourcequotas"],
                    }
                ],
            }
        ],
    }
    control_plane.kubectl("create", "namespace", namespace)
    control_plane.kubectl("create", "-f", "-", input=json.dumps(configuration))
    tally = _tally(control_plane, tmp_path / "tally.log", TALLY_NAMESPACE=namespace)
    try:
        tally.start()
        log = tally.log_text(tail=10_000)
    finally:
        tally.kill()
        control_plane.kubectl("delete", "validatingwebhookconfiguration", dead, check=False)
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    assert "failed permanently" not in log
    lines = [line for line in log.splitlines() if "could not tell whether" in line]
    assert len(lines) == 1, log
    (line,) = lines
    assert "[WARNING ]" in line
    assert "failed at webhook 'quota.tally.dev'" in line
    assert "webhooks run before the built-in plugin, so its state cannot be told" in line
    assert f"It must be off: {APISERVER_FLAG} " in line
    assert f"(Probe: quota {namespace}/{PROBE}, " in line
    assert [] == _probe_quotas(control_plane)
