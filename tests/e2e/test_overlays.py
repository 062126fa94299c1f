"""The optional kustomize overlays of ``manifests/`` render, and tell tally consistent things.

* ``overlays/mutual-tls``: the webhook requires the API server's client certificate; the CA
  comes from a ConfigMap mounted where ``TALLY_WEBHOOK_CLIENT_CA`` points.

Rendered with the kubectl built at the cluster's version (``kubectl kustomize``); the tally
settings in the rendered Deployment are checked by tally's own settings model. No control plane
is needed.
"""

from __future__ import annotations

import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

import cluster
from tally.settings import Settings

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


def test_mutual_tls_overlay() -> None:
    base, objects = render(REPO / "manifests"), render(REPO / "overlays" / "mutual-tls")
    assert keys(base) == keys(objects)  # the base, patched, and nothing else
    spec, container = tally_container(objects)
    env = tally_env(container, "tally-system")
    Settings.from_env(env)  # tally's own checks accept it
    _, base_container = tally_container(base)
    assert "TALLY_WEBHOOK_CLIENT_CA" not in tally_env(base_container, "tally-system")
    volume = volume_for(spec, container, env["TALLY_WEBHOOK_CLIENT_CA"])
    assert {"name": "tally-webhook-client-ca"} == volume["configMap"]  # not optional
    assert "ca.crt" == volume["inside"]
    assert volume["readOnly"]
