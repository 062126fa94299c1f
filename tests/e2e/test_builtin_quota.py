"""Start-up detection of the cluster's own quota system (``tally.builtin_quota``).

tally replaces upstream's ResourceQuota admission plugin and resourcequota controller, so it
must not enforce beside them. Each test runs tally as a subprocess (``TallyProcess``) and looks
only at what can be seen from outside: its exit status, its log, the webhook configuration and
the probe quota in the API.

* **Reference mode** (upstream's quota system on): tally exits with status 1 and the message
  naming both flags; it registered no webhook configuration and left no probe quota behind.
  With ``TALLY_ALLOW_BUILTIN_QUOTA=true`` it starts, with a warning.
* **Either part alone** (reference mode with the controller turned off, or with the admission
  plugin turned off; a control plane of its own, ~3 s to start): tally stops, and the message
  names that part's flag only.
* **Operator mode**: tally starts, logs that the built-in system is off, and removes the probe
  (and a leftover probe a killed start would leave). Two replicas starting together both
  conclude: neither deletes the other's probe mid-run.
* **A dead webhook** in front of the probe namespace (what a killed tally can leave behind) is
  not taken for the built-in plugin: tally cannot tell, says so, and starts (fail-open).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from operator_process import OperatorError, TallyProcess

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
REFUSAL_BOUND_S = 30.0
"""From starting the process to its exit: Python and Kopf start-up (~1 s) plus the probe, which
is bounded by 10 s (``TIMEOUT_S``) and takes well under a second against upstream."""


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


def _refused(tally: TallyProcess) -> str:
    """Start ``tally``, expect it to exit by itself; return the refusal line of its log."""
    started = time.monotonic()
    try:
        with pytest.raises(OperatorError, match="tally exited with"):
            tally.start(timeout=REFUSAL_BOUND_S)
    finally:
        tally.kill()
    assert time.monotonic() - started < REFUSAL_BOUND_S
    assert tally.process is not None
    assert 1 == tally.process.returncode
    log = tally.log_text(tail=10_000)
    # Kopf logs the PermanentError of the start handler at ERROR, message first.
    lines = [line for line in log.splitlines() if "Activity 'start' failed permanently" in line]
    assert len(lines) == 1, log
    (line,) = lines
    assert "[ERROR   ]" in line
    assert "tally will not enforce quotas: the cluster's built-in quota system is on. " in line
    assert "Or set TALLY_ALLOW_BUILTIN_QUOTA=true to run tally beside it anyway." in line
    # Nothing registered (the registrar starts only after the probe).
    assert "registered at" not in log
    assert not tally.webhook_registered()
    return line


def _probe_quotas(plane: ControlPlane) -> list[str]:
    """Every probe quota in the cluster (by the probe's label, in any namespace)."""
    listed = plane.kubectl("get", "resourcequota", "-A", "-l", PROBE_SELECTOR, "-o", "name")
    return listed.stdout.split()


def _probe_took_ms(line: str) -> int:
    found = re.search(rf"\(Probe: quota [a-z0-9-]+/{PROBE}, (\d+) ms\.\)", line)
    assert found, line
    return int(found.group(1))


# -- reference mode: upstream's quota system is on


def test_reference_mode_stops_tally_with_the_message(
    reference_plane: ControlPlane, tmp_path: Path
) -> None:
    line = _refused(_tally(reference_plane, tmp_path / "tally.log"))
    assert PLUGIN_ON in line
    assert CONTROLLER_ON in line
    assert f"Turn it off: {APISERVER_FLAG} " in line
    assert f" and {CONTROLLER_MANAGER_FLAG} " in line
    # TALLY_NAMESPACE unset: the probe ran in kube-system, which every tally webhook exempts.
    assert f"(Probe: quota kube-system/{PROBE}, " in line
    print(f"probe against reference mode: {_probe_took_ms(line)} ms")
    assert [] == _probe_quotas(reference_plane)


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
def test_either_part_alone_stops_tally(
    partial_plane: ControlPlane,
    seen: tuple[str, str],
    flag: str,
    not_named: str,
    tmp_path: Path,
) -> None:
    line = _refused(_tally(partial_plane, tmp_path / "tally.log"))
    for words in seen:
        assert words in line
    assert f"Turn it off: {flag} " in line
    assert not_named not in line
    assert [] == _probe_quotas(partial_plane)


# -- operator mode: upstream's quota system is off


def test_operator_mode_starts_and_leaves_no_probe_behind(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    # A leftover probe, as a start killed mid-probe would leave it: removed and replaced.
    leftover = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {
            "name": PROBE,
            "namespace": "kube-system",
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
