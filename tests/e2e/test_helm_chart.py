"""charts/tally: the Helm chart renders what ``manifests/`` and its overlays render.

Helm is the one ``hack/helm.py`` builds at the pinned version (into the cache, once); kubectl is
the control plane's. Helm keeps its own state (repositories, plugins, cache) in a temporary
directory, never in the user's home.

* ``helm lint --strict`` is clean, for the defaults and every non-default combination below.
* **Defaults equal** ``kubectl kustomize manifests/``, object for object, compared parsed. What
  is normalised, and why:

  - Helm's standard labels ``app.kubernetes.io/instance``, ``app.kubernetes.io/version``,
    ``app.kubernetes.io/managed-by`` and ``helm.sh/chart`` on every templated object's
    ``metadata.labels`` (checked for their values, then removed): they say which release owns
    an object, which a kustomize install has no notion of. Selectors and pod labels carry none.
  - The CRDs: Helm installs ``charts/tally/crds/`` verbatim and never templates them, so they
    lack the two labels kustomize's ``labels:`` adds to every object; the chart's CRDs must
    equal ``crds/*.yaml`` exactly and kustomize's must be those plus the two labels.
  - The Namespace: not rendered by default (``namespace.create``: ``helm install`` stores the
    release in its namespace before it creates anything, so a chart cannot create its own
    namespace; values.yaml), and rendered equal to kustomize's with ``namespace.create=true``.

  Nothing else: names, namespaces, specs, env order, comments aside everything is compared.
* The overlays as values: ``certificates.mode=cert-manager`` equals
  ``kubectl kustomize overlays/cert-manager``, and ``webhook.mutualTLS.enabled=false`` with
  ``webhook.allowedSources`` equals ``overlays/control-plane-network``, with the same label
  normalisation, and for cert-manager one more:
  the container's env, volumeMounts and the pod's volumes compared as sets keyed by name (the
  overlay's strategic-merge patch puts new list items first; the chart puts the mount where
  the Secret setting was; no value refers to another with ``$(VAR)``, so order means nothing).
* The other values (watched namespaces, one replica without leader election, failure policy,
  image, resources, scheduling, RBAC) change the fields they must, and tally's own settings
  model (``Settings.from_env``) accepts the rendered environment. Combinations that cannot
  work (two replicas without leader election) and unknown values fail to render.
* On the control plane: the render applies with a server-side dry run, and ``helm install``
  with the two commands of docs/install.md ("With Helm") installs it for real (no kubelet: the
  pods stay Pending), then ``helm uninstall`` removes it.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import tarfile
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from operator_process import revoke_cluster_roles

import cluster
import helm
from tally.app.settings import Settings
from tally.webhook import certs
from tally_e2e import ControlPlane

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tally"
RELEASE = "tally"
NAMESPACE = "tally-system"
HELM_LABELS = (
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)
KUSTOMIZE_LABELS = {"app.kubernetes.io/name": "tally", "app.kubernetes.io/part-of": "tally"}

Obj = dict[str, Any]
Key = tuple[str, str, str]


# -- running helm and kubectl


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment for every helm command: its state in a directory of the module's."""
    home = tmp_path_factory.mktemp("helm-home")
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def run_helm(
    env: dict[str, str], *args: str, kubeconfig: Path | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    command = [str(helm.ensure_helm()), *args]
    if kubeconfig is not None:
        command.append(f"--kubeconfig={kubeconfig}")
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=180, check=False
    )
    if check:
        assert 0 == result.returncode, f"{shlex.join(command)}:\n{result.stdout}{result.stderr}"
    return result


def parse(text: str) -> list[Obj]:
    return [o for o in yaml.safe_load_all(text) if o]


def render(env: dict[str, str], *values: str, namespace: str = NAMESPACE) -> list[Obj]:
    """``helm template`` with the CRDs, ``values`` as ``--set`` pairs."""
    sets = [f"--set={value}" for value in values]
    args = ["template", RELEASE, str(CHART), f"--namespace={namespace}", "--include-crds", *sets]
    return parse(run_helm(env, *args).stdout)


def kustomize(directory: Path) -> list[Obj]:
    result = subprocess.run(
        [str(cluster.ensure_binaries() / "kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == result.returncode, result.stderr
    return parse(result.stdout)


def key(obj: Obj) -> Key:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def by_key(objects: list[Obj]) -> dict[Key, Obj]:
    keyed = {key(o): o for o in objects}
    assert len(keyed) == len(objects), "an object is rendered twice"
    return keyed


def without_helm_labels(obj: Obj) -> Obj:
    """``obj`` without Helm's standard labels, after checking that they say this release."""
    if obj["kind"] == "CustomResourceDefinition":
        return obj  # crds/ is not templated: no labels to remove
    labels = dict(obj["metadata"]["labels"])
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert {
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/version": chart["appVersion"],
        "app.kubernetes.io/managed-by": "Helm",
        "helm.sh/chart": f"tally-{chart['version']}",
    } == {label: labels.pop(label) for label in HELM_LABELS}, key(obj)
    return {**obj, "metadata": {**obj["metadata"], "labels": labels}}


def normalised(objects: list[Obj]) -> dict[Key, Obj]:
    return by_key([without_helm_labels(o) for o in objects])


def crd_files() -> dict[Key, Obj]:
    return by_key([yaml.safe_load(path.read_text()) for path in sorted(REPO.glob("crds/*.yaml"))])


def tally_container(objects: list[Obj]) -> tuple[Obj, Obj]:
    """The Deployment's pod spec and its tally container."""
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def tally_env(container: Obj, namespace: str = NAMESPACE) -> dict[str, str]:
    """The TALLY_* environment as tally sees it (the namespace from its fieldRef)."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace":
            env[item["name"]] = namespace
    return {k: v for k, v in env.items() if k.startswith("TALLY_")}


def kinds(objects: list[Obj]) -> set[Key]:
    return {key(o) for o in objects}


# -- lint


LINTED = {
    "defaults": [],
    "cert-manager": ["certificates.mode=cert-manager"],
    "control-plane-network": [
        "webhook.mutualTLS.enabled=false", "webhook.allowedSources[0].ipBlock.cidr=192.0.2.0/24",
    ],
    "unauthenticated": ["webhook.mutualTLS.enabled=false", "webhook.unauthenticated=true"],
    "namespaces": ["watchedNamespaces={team-a,team-b}"],
    "one-replica": ["replicaCount=1", "leaderElection.enabled=false"],
    "everything": [
        "certificates.mode=cert-manager", "webhook.mutualTLS.enabled=true",
        "webhook.mutualTLS.clientCA=x", "webhook.failurePolicy=Ignore", "namespace.create=true",
        "rbac.countAnyResource=false", "watchedNamespaces={a}", "replicaCount=3",
    ],
}  # fmt: skip


@pytest.mark.parametrize("values", LINTED.values(), ids=LINTED.keys())
def test_lint_is_clean(helm_env: dict[str, str], values: list[str]) -> None:
    sets = [f"--set={value}" for value in values]
    result = run_helm(helm_env, "lint", "--strict", str(CHART), f"--namespace={NAMESPACE}", *sets)
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout
    # --strict fails on warnings; INFO (the missing icon) is all that may be left.
    findings = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert all(line.startswith("[INFO] Chart.yaml: icon is recommended") for line in findings), (
        result.stdout
    )


# -- the defaults are manifests/


def test_defaults_render_the_kustomize_objects(helm_env: dict[str, str]) -> None:
    chart = normalised(render(helm_env))
    manifests = by_key(kustomize(REPO / "manifests"))
    crds = crd_files()

    # The CRDs: crds/*.yaml verbatim; kustomize's are the same plus its two labels.
    for crd_key, crd in crds.items():
        assert crd == chart.pop(crd_key)
        from_kustomize = manifests.pop(crd_key)
        assert KUSTOMIZE_LABELS == from_kustomize["metadata"].pop("labels")
        assert crd == from_kustomize

    # The Namespace only with namespace.create; then kustomize's exactly.
    namespace = manifests.pop(("Namespace", "", NAMESPACE))
    assert ("Namespace", "", NAMESPACE) not in chart
    with_namespace = normalised(render(helm_env, "namespace.create=true"))
    assert namespace == with_namespace.pop(("Namespace", "", NAMESPACE))
    assert set(with_namespace) == set(chart) | set(crds)

    # Everything else, exactly.
    assert sorted(manifests) == sorted(chart)
    for object_key, expected in manifests.items():
        assert expected == chart[object_key], object_key


def test_versions_agree(helm_env: dict[str, str]) -> None:
    """The chart's appVersion is tally's version and the kustomization's image tag."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    kustomization = yaml.safe_load((REPO / "manifests" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert project["version"] == chart["appVersion"] == image["newTag"]


def test_crds_are_the_repository_crds(helm_env: dict[str, str], tmp_path: Path) -> None:
    """charts/tally/crds/ holds copies of crds/*.yaml, byte for byte, and ``helm package`` puts
    them in the archive. Copies, not links: Helm follows a link but logs a warning for each on
    every command (a user would see them at every install), and links do not survive every
    checkout or GitOps source. This test is what keeps the copies from drifting."""
    sources = {p.name: p.read_bytes() for p in sorted(REPO.glob("crds/*.yaml"))}
    copies = {p.name: p.read_bytes() for p in sorted(CHART.glob("crds/*"))}
    fix = f"cp {' '.join(f'crds/{name}' for name in sources)} charts/tally/crds/"
    assert sources == copies, f"the chart's CRDs are not crds/*.yaml; to fix: {fix}"

    run_helm(helm_env, "package", str(CHART), f"--destination={tmp_path}")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    packaged: dict[str, bytes] = {}
    with tarfile.open(tmp_path / f"tally-{chart['version']}.tgz") as archive:
        for member in archive.getmembers():
            if member.name.startswith("tally/crds/"):
                content = archive.extractfile(member)
                assert content is not None
                packaged[Path(member.name).name] = content.read()
    assert sources == packaged


# -- the overlays are values


def test_cert_manager_is_the_overlay(helm_env: dict[str, str]) -> None:
    chart = normalised(render(helm_env, "certificates.mode=cert-manager"))
    overlay = by_key(kustomize(REPO / "overlays" / "cert-manager"))
    for crd_key in crd_files():
        chart.pop(crd_key)
        overlay.pop(crd_key)
    overlay.pop(("Namespace", "", NAMESPACE))
    assert sorted(overlay) == sorted(chart)

    def keyed_pod_lists(deployment: Obj) -> Obj:
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        for item in container["env"]:
            assert "$(" not in item.get("value", "")
        lists = {
            "env": {e["name"]: e for e in container.pop("env")},
            "volumeMounts": {m["name"]: m for m in container.pop("volumeMounts")},
            "volumes": {v["name"]: v for v in spec.pop("volumes")},
        }
        return {"deployment": deployment, **lists}

    deployment = ("Deployment", NAMESPACE, "tally")
    assert keyed_pod_lists(overlay.pop(deployment)) == keyed_pod_lists(chart.pop(deployment))
    for object_key, expected in overlay.items():
        assert expected == chart[object_key], object_key


def test_control_plane_network_is_the_overlay(helm_env: dict[str, str]) -> None:
    chart = normalised(
        render(
            helm_env,
            "webhook.mutualTLS.enabled=false",
            "webhook.allowedSources[0].ipBlock.cidr=192.0.2.0/24",
        )
    )
    overlay = by_key(kustomize(REPO / "overlays" / "control-plane-network"))
    overlay.pop(("Namespace", "", NAMESPACE))
    for crd_key in crd_files():
        chart.pop(crd_key)
        overlay.pop(crd_key)
    assert sorted(overlay) == sorted(chart)
    for object_key, expected in overlay.items():
        assert expected == chart[object_key], object_key


def test_a_webhook_nobody_authenticates_does_not_render(helm_env: dict[str, str]) -> None:
    # Neither mutual TLS nor a fence: anything in the cluster could post forged reviews.
    result = run_helm(
        helm_env, "template", RELEASE, str(CHART), f"--namespace={NAMESPACE}",
        "--set=webhook.mutualTLS.enabled=false", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "webhook.mutualTLS.enabled=false needs webhook.allowedSources" in result.stderr
    # Unless asked for in so many words; then the port admits any source.
    objects = render(helm_env, "webhook.mutualTLS.enabled=false", "webhook.unauthenticated=true")
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert all("from" not in rule for rule in policy["spec"]["ingress"])
    _, container = tally_container(objects)
    assert "TALLY_WEBHOOK_CLIENT_CA" not in tally_env(container)


def test_mutual_tls_client_ca_from_values(helm_env: dict[str, str], tmp_path: Path) -> None:
    """``--set-file webhook.mutualTLS.clientCA=…``: the chart creates the ConfigMap the pod
    mounts, holding that CA."""
    now = datetime.datetime.now(datetime.UTC)
    ca, _ = certs.new_ca(now, datetime.timedelta(days=1), common_name="api-server-webhook-client")
    pem = tmp_path / "ca.crt"
    pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    sets = ["--set=webhook.mutualTLS.enabled=true", f"--set-file=webhook.mutualTLS.clientCA={pem}"]
    objects = parse(
        run_helm(
            helm_env, "template", RELEASE, str(CHART), f"--namespace={NAMESPACE}", *sets
        ).stdout
    )
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    assert ("ConfigMap", NAMESPACE, "tally-webhook-client-ca") == key(config_map)
    assert [ca] == x509.load_pem_x509_certificates(config_map["data"]["ca.crt"].encode())

    spec, container = tally_container(objects)
    env = tally_env(container)
    Settings.from_env(env)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "webhook-client-ca"]
    assert f"{mount['mountPath']}/ca.crt" == env["TALLY_WEBHOOK_CLIENT_CA"]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "webhook-client-ca"]
    assert {"name": config_map["metadata"]["name"]} == volume["configMap"]


# -- the other values


def test_another_namespace(helm_env: dict[str, str]) -> None:
    """Everything follows the release namespace: objects, bindings' subjects, the names tally
    is reached by and checks its certificate for, its Secret, cert-manager's dnsNames."""
    namespace = "quota-operator"
    objects = render(helm_env, "certificates.mode=cert-manager", namespace=namespace)
    text = yaml.safe_dump_all(objects)
    assert NAMESPACE not in text
    for obj in objects:
        if obj["kind"] not in {"CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}:
            assert namespace == obj["metadata"]["namespace"], key(obj)
        for subject in obj.get("subjects", []):
            assert {"kind": "ServiceAccount", "name": "tally", "namespace": namespace} == subject
    _, container = tally_container(objects)
    settings = Settings.from_env(tally_env(container, namespace))
    service = settings.webhook_service_ref
    assert service is not None
    assert (namespace, "tally-webhook") == (service.namespace, service.name)
    (certificate,) = [
        o
        for o in objects
        if o["kind"] == "Certificate" and o["metadata"]["name"] == "tally-webhook"
    ]
    assert set(service.dns_names) <= set(certificate["spec"]["dnsNames"])
    assert settings.webhook_host in certificate["spec"]["dnsNames"]

    secret_mode = render(helm_env, namespace=namespace)
    _, container = tally_container(secret_mode)
    assert (
        f"{namespace}/tally-webhook-tls"
        == tally_env(container, namespace)["TALLY_WEBHOOK_CERT_SECRET"]
    )


def test_watched_namespaces(helm_env: dict[str, str]) -> None:
    """TALLY_NAMESPACES, and Kopf run with the same --namespace flags: the image's entry point
    (the Dockerfile's) with --namespace flags for --all-namespaces."""
    objects = render(helm_env, "watchedNamespaces={team-a,team-b}")
    _, container = tally_container(objects)
    env = tally_env(container)
    assert frozenset({"team-a", "team-b"}) == Settings.from_env(env).watched_namespaces
    dockerfile = (REPO / "Dockerfile").read_text()
    match = re.search(r"^ENTRYPOINT (\[.*?\])$", dockerfile.replace("\\\n", ""), re.M | re.S)
    assert match is not None
    entry_point = json.loads(match.group(1))
    at = entry_point.index("--all-namespaces")
    expected = [*entry_point[:at], "--namespace=team-a", "--namespace=team-b"]
    assert [*expected, *entry_point[at + 1 :]] == container["command"]
    assert "args" not in container

    _, default = tally_container(render(helm_env))
    assert "command" not in default  # the image's own, with --all-namespaces
    assert "TALLY_NAMESPACES" not in tally_env(default)


def test_one_replica_without_leader_election(helm_env: dict[str, str]) -> None:
    objects = render(helm_env, "replicaCount=1", "leaderElection.enabled=false")
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert 1 == deployment["spec"]["replicas"]
    # Two pods without a Lease would both run the controllers, even for the length of a rollout.
    assert {"type": "Recreate"} == deployment["spec"]["strategy"]
    _, container = tally_container(objects)
    env = tally_env(container)
    assert "false" == env["TALLY_LEADER_ELECTION"]
    assert not Settings.from_env(env).leader_election
    # No Role for a Lease nobody takes, and no budget that would block every drain.
    assert kinds(render(helm_env)) - kinds(objects) == {
        ("Role", NAMESPACE, "tally-leader-election"),
        ("RoleBinding", NAMESPACE, "tally-leader-election"),
        ("PodDisruptionBudget", NAMESPACE, "tally"),
    }

    # One replica with leader election keeps the rolling update and the Lease, drops the budget.
    single = render(helm_env, "replicaCount=1")
    (deployment,) = [o for o in single if o["kind"] == "Deployment"]
    assert 0 == deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"]
    assert kinds(render(helm_env)) - kinds(single) == {("PodDisruptionBudget", NAMESPACE, "tally")}


def test_replicas_without_leader_election_do_not_render(helm_env: dict[str, str]) -> None:
    args = ["template", RELEASE, str(CHART), "--set=leaderElection.enabled=false"]
    result = run_helm(helm_env, *args, check=False)
    assert 0 != result.returncode
    assert "leaderElection.enabled=false needs replicaCount=1" in result.stderr


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("certificates.mode=vault", "at '/certificates/mode'"),
        ("webhook.failurePolicy=Sometimes", "at '/webhook/failurePolicy'"),
        ("replicaCount=0", "at '/replicaCount'"),
        ("watchedNamespaces={Team_A}", "at '/watchedNamespaces/0'"),
        # A typo is refused, not silently ignored.
        ("leaderElection.enable=false", "at '/leaderElection': additional properties 'enable'"),
    ],
    ids=["mode", "failure-policy", "replicas", "namespace-name", "typo"],
)
def test_schema_refuses_bad_values(helm_env: dict[str, str], value: str, complaint: str) -> None:
    result = run_helm(helm_env, "template", RELEASE, str(CHART), f"--set={value}", check=False)
    assert 0 != result.returncode
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert complaint in result.stderr, result.stderr


def test_failure_policy(helm_env: dict[str, str]) -> None:
    _, container = tally_container(render(helm_env, "webhook.failurePolicy=Ignore"))
    env = tally_env(container)
    assert "Ignore" == env["TALLY_WEBHOOK_FAILURE_POLICY"]
    assert "Ignore" == Settings.from_env(env).webhook_failure_policy
    _, default = tally_container(render(helm_env))
    assert "Fail" == Settings.from_env(tally_env(default)).webhook_failure_policy


def test_image_resources_scheduling_rbac(helm_env: dict[str, str]) -> None:
    objects = render(
        helm_env,
        "image.repository=registry.example.com/tally",
        "image.tag=0.2.0",
        "image.pullPolicy=Always",
        "imagePullSecrets[0].name=registry",
        "resources.requests.cpu=1",
        "resources.limits.memory=4Gi",
        "nodeSelector.node-role\\.example\\.com/pool=system",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "rbac.countAnyResource=false",
        "rbac.aggregateToDefaultRoles=false",
    )
    spec, container = tally_container(objects)
    assert "registry.example.com/tally:0.2.0" == container["image"]
    assert "Always" == container["imagePullPolicy"]
    assert [{"name": "registry"}] == spec["imagePullSecrets"]
    assert {
        "requests": {"cpu": 1, "memory": "256Mi"},
        "limits": {"memory": "4Gi"},
    } == container["resources"]
    assert {"node-role.example.com/pool": "system"} == spec["nodeSelector"]
    assert [{"key": "dedicated", "operator": "Exists"}] == spec["tolerations"]
    assert kinds(render(helm_env)) - kinds(objects) == {
        ("ClusterRole", "", "tally-count-any-resource"),
        ("ClusterRoleBinding", "", "tally-count-any-resource"),
        ("ClusterRole", "", "tally-namespace-view"),
        ("ClusterRole", "", "tally-namespace-edit"),
    }


# -- on the control plane


@pytest.fixture
def fresh_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A namespace name nobody uses; deleted afterwards if something created it."""
    name = f"tally-helm-{uuid.uuid4().hex[:6]}"
    yield name
    control_plane.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")


def dry_run(plane: ControlPlane, objects: list[Obj]) -> subprocess.CompletedProcess[str]:
    return plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(objects), check=False
    )


@pytest.mark.parametrize(
    "values",
    [[], ["webhook.mutualTLS.enabled=true", "webhook.mutualTLS.clientCA=CA"],
     ["replicaCount=1", "leaderElection.enabled=false", "watchedNamespaces={a,b}"],
     ["certificates.mode=cert-manager"]],
    ids=["defaults", "mutual-tls", "one-replica-namespaces", "cert-manager"],
)  # fmt: skip
def test_server_side_dry_run(
    control_plane: ControlPlane, helm_env: dict[str, str], fresh_namespace: str, values: list[str]
) -> None:
    """The render applies: the API server (and its admission, Pod Security included) accepts
    every object. In the namespace ``helm install --create-namespace`` would have made (a dry
    run cannot create objects in a namespace it only pretends to create). cert-manager's
    Issuers and Certificates are left out: cert-manager is not installed here, so the API
    server does not know those kinds."""
    control_plane.kubectl("create", "namespace", fresh_namespace)
    objects = render(helm_env, *values, namespace=fresh_namespace)
    applicable = [o for o in objects if not o["apiVersion"].startswith("cert-manager.io/")]
    assert ("certificates.mode=cert-manager" in values) == (len(applicable) < len(objects))
    result = dry_run(control_plane, applicable)
    assert 0 == result.returncode, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    assert len(applicable) == len(result.stdout.splitlines()), result.stdout
    assert "(server dry run)" in result.stdout
    # Nothing was created.
    assert control_plane.kubectl(
        "get", "deployment/tally", "-n", fresh_namespace, check=False
    ).returncode


def test_helm_install_and_uninstall(
    control_plane: ControlPlane, helm_env: dict[str, str], fresh_namespace: str
) -> None:
    """docs/install.md's two commands, less the wait for a rollout that cannot finish here (no
    kubelet): ``helm install`` with ``--create-namespace`` installs every object, the release is
    deployed, NOTES say how to wait and uninstall; ``helm uninstall`` removes what it
    installed (the CRDs stay, as Helm keeps crds/; this test deletes those it created)."""
    crds = [name for (_, _, name) in crd_files()]
    had_crd = {
        name: control_plane.kubectl("get", "crd", name, check=False).returncode == 0
        for name in crds
    }
    kubeconfig = control_plane.kubeconfig
    # Other modules ran tally under the manifests' roles: a release cannot adopt those.
    revoke_cluster_roles(kubeconfig, control_plane.bin_dir)
    try:
        installed = run_helm(
            helm_env, "install", RELEASE, str(CHART), f"--namespace={fresh_namespace}",
            "--create-namespace", kubeconfig=kubeconfig,
        )  # fmt: skip
        assert "STATUS: deployed" in installed.stdout
        assert f"kubectl -n {fresh_namespace} rollout status deployment/tally" in installed.stdout
        assert "kubectl delete validatingwebhookconfiguration tally.dev" in installed.stdout

        manifest = parse(
            run_helm(
                helm_env, "get", "manifest", RELEASE, f"--namespace={fresh_namespace}",
                kubeconfig=kubeconfig,
            ).stdout
        )  # fmt: skip
        assert kinds(manifest) == kinds(render(helm_env, namespace=fresh_namespace)) - {
            key(o) for o in render(helm_env, namespace=fresh_namespace)
            if o["kind"] == "CustomResourceDefinition"
        }  # fmt: skip
        for obj in manifest:
            args = ["get", f"{obj['kind']}/{obj['metadata']['name']}", "-o", "json"]
            if "namespace" in obj["metadata"]:
                args.append(f"--namespace={obj['metadata']['namespace']}")
            live = json.loads(control_plane.kubectl(*args).stdout)
            assert RELEASE == live["metadata"]["annotations"]["meta.helm.sh/release-name"]
        for name in crds:
            assert 0 == control_plane.kubectl("get", "crd", name, check=False).returncode
        (deployment,) = [o for o in manifest if o["kind"] == "Deployment"]
        live = json.loads(
            control_plane.kubectl(
                "get", "deployment/tally", f"--namespace={fresh_namespace}", "-o", "json"
            ).stdout
        )
        assert 2 == live["spec"]["replicas"]
        assert deployment["spec"]["selector"] == live["spec"]["selector"]
    finally:
        uninstalled = run_helm(
            helm_env, "uninstall", RELEASE, f"--namespace={fresh_namespace}", "--wait",
            kubeconfig=kubeconfig, check=False,
        )  # fmt: skip
        for name, was_there in had_crd.items():
            if not was_there:
                control_plane.kubectl("delete", "crd", name, "--ignore-not-found", check=False)
    assert 0 == uninstalled.returncode, uninstalled.stderr
    for cluster_wide in ("clusterrole/tally", "clusterrolebinding/tally-count-any-resource"):
        assert control_plane.kubectl("get", cluster_wide, check=False).returncode
    assert control_plane.kubectl(
        "get", "deployment/tally", f"--namespace={fresh_namespace}", check=False
    ).returncode
