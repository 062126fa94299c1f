"""``manifests/`` and its kustomize overlays render, and tell tally consistent things.

* ``manifests/``: the webhook requires the API server's client certificate (mutual TLS); the
  CA comes from a ConfigMap mounted where ``TALLY_WEBHOOK_CLIENT_CA`` points.
* ``overlays/control-plane-network`` (a control plane that presents no client certificate):
  the same objects, without mutual TLS, and the NetworkPolicy admits nothing but the listed
  sources to the webhook port (as shipped, a documentation range to be replaced).
* ``overlays/cert-manager``: the serving certificate comes from cert-manager; the Deployment
  mounts the Certificate's Secret where ``TALLY_WEBHOOK_CERT_MOUNT`` points, the Certificate
  names every host tally checks, its Issuer is a CA (a stable caBundle), and tally keeps no
  Secret of its own (no Role for one).

Rendered with the kubectl built at the cluster's version (``kubectl kustomize``); the tally
settings in the rendered Deployment are checked by tally's own settings model. No control plane
is needed. cert-manager is not installed here, so nothing checks that cert-manager accepts the
objects or issues what they ask for: the cert-manager test stands in for it by making what the
Certificate describes (its names, a CA's ``ca.crt``) with ``tally.webhook.certs`` and having tally's
own check for mounted files (``tally.webhook.certs.problems``) accept it for the rendered hosts.
"""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

import cluster
from tally.app.settings import Settings
from tally.webhook import certs

REPO = Path(__file__).resolve().parents[2]


def render(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(cluster.ensure_binaries() / "kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 0 == result.returncode, result.stderr
    return [o for o in yaml.safe_load_all(result.stdout) if o]


def keys(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objects}


def tally_container(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Deployment's pod spec and its tally container."""
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in spec["containers"] if c["name"] == "tally"]
    return spec, container


def tally_env(container: dict[str, Any], namespace: str) -> dict[str, str]:
    """The container's TALLY_* environment as tally sees it (the namespace from the fieldRef)."""
    env: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace":
            env[item["name"]] = namespace
    return {k: v for k, v in env.items() if k.startswith("TALLY_")}


def volume_for(spec: dict[str, Any], container: dict[str, Any], path: str) -> dict[str, Any]:
    """The volume mounted where ``path`` lies, and the path inside it."""
    for mount in container["volumeMounts"]:
        if PurePosixPath(path).is_relative_to(mount["mountPath"]):
            (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
            inside = str(PurePosixPath(path).relative_to(mount["mountPath"]))
            return {**volume, "inside": inside, "readOnly": mount.get("readOnly", False)}
    raise AssertionError(f"nothing is mounted at {path}")


def test_the_base_runs_with_mutual_tls() -> None:
    spec, container = tally_container(render(REPO / "manifests"))
    env = tally_env(container, "tally-system")
    Settings.from_env(env)  # tally's own checks accept it
    volume = volume_for(spec, container, env["TALLY_WEBHOOK_CLIENT_CA"])
    assert {"name": "tally-webhook-client-ca"} == volume["configMap"]  # not optional
    assert "ca.crt" == volume["inside"]
    assert volume["readOnly"]


def test_control_plane_network_overlay() -> None:
    base = render(REPO / "manifests")
    objects = render(REPO / "overlays" / "control-plane-network")
    assert keys(base) == keys(objects)  # the base, patched, and nothing else
    spec, container = tally_container(objects)
    env = tally_env(container, "tally-system")
    Settings.from_env(env)
    assert "TALLY_WEBHOOK_CLIENT_CA" not in env
    assert "webhook-client-ca" not in {v["name"] for v in spec["volumes"]}
    assert "webhook-client-ca" not in {m["name"] for m in container["volumeMounts"]}
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    (base_policy,) = [o for o in base if o["kind"] == "NetworkPolicy"]
    webhook, metrics = policy["spec"]["ingress"]
    assert [{"port": "webhook", "protocol": "TCP"}] == webhook["ports"]
    assert [{"ipBlock": {"cidr": "192.0.2.0/24"}}] == webhook["from"]
    assert base_policy["spec"]["ingress"][1] == metrics
    assert "from" not in base_policy["spec"]["ingress"][0]


def test_cert_manager_overlay() -> None:
    base, objects = render(REPO / "manifests"), render(REPO / "overlays" / "cert-manager")
    by_kind: dict[str, dict[str, dict[str, Any]]] = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj

    # The base minus tally's own certificate Secret access, plus cert-manager's objects.
    assert keys(base) - keys(objects) == {
        ("Role", "tally-system", "tally-webhook-tls"),
        ("RoleBinding", "tally-system", "tally-webhook-tls"),
    }
    assert keys(objects) - keys(base) == {
        ("Issuer", "tally-system", "tally-selfsigned"),
        ("Certificate", "tally-system", "tally-webhook-ca"),
        ("Issuer", "tally-system", "tally-webhook-ca"),
        ("Certificate", "tally-system", "tally-webhook"),
    }

    # tally serves the mounted Secret, and keeps none of its own.
    spec, container = tally_container(objects)
    env = tally_env(container, "tally-system")
    settings = Settings.from_env(env)  # tally's own checks accept it
    assert "TALLY_WEBHOOK_CERT_SECRET" not in env
    volume = volume_for(spec, container, env["TALLY_WEBHOOK_CERT_MOUNT"] + "/tls.crt")
    assert volume["readOnly"]
    serving = by_kind["Certificate"]["tally-webhook"]
    assert {"secretName": serving["spec"]["secretName"]} == volume["secret"]

    # Issued by a CA Issuer (ca.crt is that CA: the caBundle stays as the leaf renews), whose
    # CA is a cert-manager CA Certificate from the self-signed Issuer.
    issuer = by_kind["Issuer"][serving["spec"]["issuerRef"]["name"]]
    ca_certificate = next(
        c for c in by_kind["Certificate"].values()
        if c["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]
    )  # fmt: skip
    assert ca_certificate["spec"]["isCA"] is True
    assert "selfSigned" in by_kind["Issuer"][ca_certificate["spec"]["issuerRef"]["name"]]["spec"]
    # Renewed with a third left, like tally's own certificates.
    hours = {"8760h": 8760, "2920h": 2920}
    assert 3 * hours[serving["spec"]["renewBefore"]] == hours[serving["spec"]["duration"]]

    # What that Certificate describes is what tally accepts for the hosts it checks.
    service = settings.webhook_service_ref
    assert service is not None
    hosts = [settings.webhook_host or settings.webhook_addr, *service.dns_names]
    now = datetime.datetime.now(datetime.UTC)
    ca, ca_key = certs.new_ca(now, datetime.timedelta(days=5 * 365))
    cert, key = certs.new_serving_certificate(
        ca, ca_key, serving["spec"]["dnsNames"], now, datetime.timedelta(days=365)
    )
    mounted = certs.Material(cas=(ca,), ca_key=None, cert=cert, key=key)
    assert ("", []) == certs.problems(mounted, hosts, now, settings.certificate_policy)
