"""The PodSet CRD on the real control plane (operator mode, no tally running).

What the API server does with ``crds/podsets.tally.dev.yaml`` alone: defaults, the scale
subresource (upstream e2e ``test/e2e/apps/replica_set.go`` "Replicaset should have a working
scale subresource"), printer columns, short name and category, schema and CEL rejections, and
the examples under ``crds/examples/``. The last test checks the webhook's validation
(:func:`tally.podset.validation.validate_podset`) against apps/v1: the same spec as a ReplicaSet,
dry-run on this API server, must fail with the same messages.

The CRD is applied once per module and left installed: it is cluster-scoped, other modules use
it, and ``kubectl apply`` is idempotent.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

import builders
from tally.podset.validation import validate_podset
from tally_e2e import ControlPlane

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "podsets.tally.dev.yaml"
EXAMPLES = REPO / "crds" / "examples"
GROUP, VERSION, PLURAL = "tally.dev", "v1alpha1", "podsets"
DEMO_NAMESPACE = "tally-demo"

Obj = dict[str, Any]


@pytest.fixture(scope="module")
def podset_crd(control_plane: ControlPlane) -> None:
    control_plane.kubectl("apply", "-f", str(CRD))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/podsets.tally.dev", "--timeout=60s"
    )


def podset(name: str, **spec: Any) -> Obj:
    """A valid PodSet; keyword arguments replace top-level spec fields (``None`` removes one)."""
    body = builders.podset(name, containers=[builders.container("app")])
    for key, value in spec.items():
        if value is None:
            body["spec"].pop(key, None)
        else:
            body["spec"][key] = value
    return body


def custom_objects(api: client.ApiClient) -> Any:
    """The custom objects client, untyped: its generated annotations accept neither plain
    ``dict`` bodies nor ``_content_type``, both of which it handles."""
    return client.CustomObjectsApi(api)


def apps_v1(api: client.ApiClient) -> Any:
    """``AppsV1Api``, untyped for the same reason."""
    return client.AppsV1Api(api)


async def create(api: client.ApiClient, namespace: str, body: Obj) -> Obj:
    created = await custom_objects(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    return dict(created)


async def read(api: client.ApiClient, namespace: str, name: str) -> Obj:
    found = await custom_objects(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return dict(found)


async def write_status(api: client.ApiClient, namespace: str, name: str, status: Obj) -> None:
    """Stand in for the controller: write ``status`` through the status subresource."""
    await custom_objects(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status},
        _content_type="application/merge-patch+json",
    )  # fmt: skip


def rejection(error: client.ApiException) -> list[str]:
    """The API server's field errors (``details.causes``) as ``<field>: <message>`` lines."""
    status = json.loads(error.body or b"{}")
    return [
        f"{cause.get('field', '<nil>')}: {cause['message']}"
        for cause in (status.get("details") or {}).get("causes") or []
    ]


async def test_defaults_are_applied(
    podset_crd: None, api: client.ApiClient, namespace: str
) -> None:
    created = await create(api, namespace, podset("web"))
    stored = await read(api, namespace, "web")
    assert created["spec"] == stored["spec"]
    assert 1 == stored["spec"]["replicas"]
    assert 0 == stored["spec"]["minReadySeconds"]
    # Empty selector parts are defaulted so that CEL's `self == oldSelf` is apps/v1's
    # semantic comparison (absent == empty).
    assert {"matchLabels": {"app": "web"}, "matchExpressions": []} == stored["spec"]["selector"]
    assert 1 == stored["metadata"]["generation"]
    assert "status" not in stored


async def test_kubectl_scale_uses_the_scale_subresource(
    podset_crd: None, control_plane: ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    # Upstream e2e "Replicaset should have a working scale subresource".
    await create(api, namespace, podset("web", replicas=2))
    control_plane.kubectl("scale", "podset/web", "--replicas=4", "-n", namespace)
    stored = await read(api, namespace, "web")
    assert 4 == stored["spec"]["replicas"]
    assert 2 == stored["metadata"]["generation"]

    # What an HPA reads: replicas from the spec and status, the selector as a string.
    await write_status(api, namespace, "web", {"replicas": 3, "selector": "app=web"})
    custom = custom_objects(api)
    scale = await custom.get_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, "web"
    )
    assert {"replicas": 4} == scale["spec"]
    assert {"replicas": 3, "selector": "app=web"} == scale["status"]

    await custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, namespace, PLURAL, "web", {"spec": {"replicas": 0}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    assert 0 == (await read(api, namespace, "web"))["spec"]["replicas"]


async def test_scale_subresource_refuses_negative_replicas(
    podset_crd: None, api: client.ApiClient, namespace: str
) -> None:
    await create(api, namespace, podset("web"))
    with pytest.raises(client.ApiException) as refused:
        await custom_objects(api).patch_namespaced_custom_object_scale(
            GROUP, VERSION, namespace, PLURAL, "web", {"spec": {"replicas": -1}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
    assert 422 == refused.value.status
    assert "spec.replicas: Invalid value: -1" in str(refused.value.body)
    assert 1 == (await read(api, namespace, "web"))["spec"]["replicas"]


async def test_kubectl_get_prints_the_columns(
    podset_crd: None, control_plane: ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    await create(api, namespace, podset("web", replicas=3))
    await write_status(
        api, namespace, "web", {"replicas": 2, "readyReplicas": 1, "selector": "app=web"}
    )
    listed = control_plane.kubectl("get", "podsets", "-n", namespace).stdout.splitlines()
    assert ["NAME", "DESIRED", "CURRENT", "READY", "AGE"] == listed[0].split()
    assert ["web", "3", "2", "1"] == listed[1].split()[:4]

    wide = control_plane.kubectl("get", "ps", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert ["NAME", "DESIRED", "CURRENT", "READY", "AGE", "SELECTOR"] == wide[0].split()
    assert "app=web" == wide[1].split()[-1]

    # The short name and both categories find it.
    for resource in ("ps", "tally", "all"):
        names = control_plane.kubectl("get", resource, "-n", namespace, "-o", "name").stdout
        assert "podset.tally.dev/web" in names.split(), resource


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            podset("bad", replicas=-1),
            ["spec.replicas: Invalid value: -1: spec.replicas in body should be greater than "
             "or equal to 0",
             # The scale subresource's own check on specReplicasPath.
             ".spec.replicas: Invalid value: -1: should be a non-negative integer"],
            id="negative-replicas",
        ),
        pytest.param(
            podset("bad", minReadySeconds=-5),
            ["spec.minReadySeconds: Invalid value: -5: spec.minReadySeconds in body should be "
             "greater than or equal to 0"],
            id="negative-min-ready-seconds",
        ),
        pytest.param(
            podset("bad", replicas=2**31),
            ["spec.replicas: Invalid value: 2147483648: spec.replicas in body should be less "
             "than or equal to 2147483647",
             ".spec.replicas: Invalid value: 2147483648: should be less than or equal to "
             "2147483647"],
            id="replicas-beyond-int32",
        ),
        pytest.param(
            podset("bad", minReadySeconds=2**31),
            ["spec.minReadySeconds: Invalid value: 2147483648: spec.minReadySeconds in body "
             "should be less than or equal to 2147483647"],
            id="min-ready-seconds-beyond-int32",
        ),
        pytest.param(podset("bad", selector=None), ["spec.selector: Required value"],
                     id="missing-selector"),
        pytest.param(podset("bad", template=None), ["spec.template: Required value"],
                     id="missing-template"),
        pytest.param(
            podset("bad", selector={"matchLabels": {}}),
            ["spec.selector: Invalid value: empty selector is invalid for podset"],
            id="empty-selector",
        ),
        pytest.param(
            podset("bad", selector={"matchExpressions": [{"key": "app", "operator": "Is"}]}),
            ['spec.selector.matchExpressions[0].operator: Unsupported value: "Is": supported '
             'values: "In", "NotIn", "Exists", "DoesNotExist"'],
            id="unknown-operator",
        ),
        pytest.param(
            podset("bad", template={"metadata": {"labels": {"app": 1}}, "spec": {}}),
            ['spec.template.metadata.labels.app: Invalid value: "integer": '
             'spec.template.metadata.labels.app in body must be of type string: "integer"'],
            id="label-not-a-string",
        ),
    ],
)  # fmt: skip
async def test_schema_rejects_invalid_podsets(
    podset_crd: None, api: client.ApiClient, namespace: str, body: Obj, expected: list[str]
) -> None:
    with pytest.raises(client.ApiException) as refused:
        await create(api, namespace, body)
    assert 422 == refused.value.status
    # CEL adds "some validation rules were not checked" (field <nil>) after schema errors.
    assert expected == [c for c in rejection(refused.value) if not c.startswith("<nil>")]


async def test_selector_is_immutable(
    podset_crd: None, api: client.ApiClient, namespace: str
) -> None:
    await create(api, namespace, podset("web", replicas=1))
    custom = custom_objects(api)
    with pytest.raises(client.ApiException) as refused:
        await custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "web",
            {"spec": {"selector": {"matchLabels": {"app": "web", "tier": "a"}}}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
    assert 422 == refused.value.status
    assert ["spec.selector: Invalid value: field is immutable"] == rejection(refused.value)

    # The same selector spelt with explicit empty parts is no change (apps/v1: Semantic).
    same = {"matchLabels": {"app": "web"}, "matchExpressions": []}
    await custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "web", {"spec": {"selector": same, "replicas": 2}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip
    assert 2 == (await read(api, namespace, "web"))["spec"]["replicas"]


@contextlib.contextmanager
def demo_namespace(control_plane: ControlPlane) -> Iterator[None]:
    """``tally-demo`` from the examples' own namespace file, deleted afterwards if we made it."""
    deadline = time.monotonic() + 60
    while True:
        found = control_plane.kubectl(
            "get", "namespace", DEMO_NAMESPACE, "-o", "json", "--ignore-not-found", check=False
        ).stdout.strip()
        phase = json.loads(found)["status"].get("phase") if found else None
        if phase != "Terminating":
            break
        assert time.monotonic() < deadline, f"{DEMO_NAMESPACE} stayed Terminating"
        time.sleep(0.5)
    created = not found
    control_plane.kubectl("apply", "-f", str(EXAMPLES / "00-namespace.yaml"))
    try:
        yield
    finally:
        if created:
            control_plane.kubectl("delete", "namespace", DEMO_NAMESPACE, "--wait=false")


def test_examples_apply_cleanly(podset_crd: None, control_plane: ControlPlane) -> None:
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert [
        "00-namespace.yaml", "10-quota.yaml", "20-podset.yaml", "30-clusterquota.yaml",
        "31-podset-measure.yaml",
    ] == [p.name for p in examples]  # fmt: skip
    # The ClusterQuota example needs its CRD (`make run` applies every CRD first).
    control_plane.kubectl("apply", "-f", str(EXAMPLES.parent / "clusterquotas.tally.dev.yaml"))
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/clusterquotas.tally.dev", "--timeout=60s"
    )
    with demo_namespace(control_plane):
        for example in examples[1:]:
            applied = control_plane.kubectl("apply", "--dry-run=server", "-f", str(example))
            assert "(server dry run)" in applied.stdout, applied.stdout
        # And the webhook would let the PodSet in.
        for document in yaml.safe_load_all((EXAMPLES / "20-podset.yaml").read_text()):
            assert [] == validate_podset(document)


# --- validate_podset against apps/v1 -------------------------------------------------------

_C = [{"name": "c", "image": "registry.example/app:1"}]


def _spec(**fields: Any) -> Obj:
    spec: Obj = {
        "replicas": 0,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": _C}},
    }
    spec.update(fields)
    return spec


def _template(labels: Any = None, **pod: Any) -> Obj:
    metadata = {"labels": {"app": "web"} if labels is None else labels}
    return {"metadata": metadata, "spec": {"containers": _C, **pod}}


APPS_V1_CASES = [
    pytest.param(_spec(), id="valid"),
    pytest.param(
        _spec(replicas=-1, minReadySeconds=-2, selector={"matchLabels": {"app": "x"}},
              template=_template({"app": "web", "tier": "a"}, restartPolicy="OnFailure",
                                 activeDeadlineSeconds=5, containers=[])),
        id="spec-and-template",
    ),
    pytest.param(_spec(selector={}), id="empty-selector"),
    pytest.param(_spec(selector=None), id="missing-selector"),
    pytest.param(
        _spec(selector={
            "matchLabels": {"b": "-x", "a/b/c": "v"},
            "matchExpressions": [
                {"key": "app", "operator": "In", "values": []},
                {"key": "-bad", "operator": "Exists"},
                {"key": "a", "operator": "Foo", "values": ["a"]},
                {"key": "b", "operator": "Exists", "values": ["x"]},
                {"key": "c", "operator": "NotIn", "values": ["-v"]},
            ],
        }),
        id="invalid-selector",
    ),
    pytest.param(
        _spec(selector={"matchLabels": {"app": "web"},
                        "matchExpressions": [{"key": "t", "operator": "NotIn", "values": ["a"]}]},
              template=_template({"app": "web", "t": "a"})),
        id="expression-excludes-template",
    ),
    pytest.param(
        _spec(template={"metadata": {
            "labels": {"app": "web", "-k": "v", "ok": "not valid!", "example.com/": "x",
                       "Bad_Prefix/x": "y", "": "x", "/a": "b", "P" * 254 + "/n": "v",
                       "q/" + "n" * 64: "x", "k": "v" * 64, "a/b/c": "d"},
            "annotations": {"-a": "b", "Upper/ok": "x", "a//b": "x", "big": "x" * 262144},
        }, "spec": {"containers": _C}}),
        id="labels-and-annotations",
    ),
    pytest.param(
        _spec(template=_template(containers=[
            {}, {"name": "c", "image": "x"}, {"name": "c"}, {"name": "Bad_Name", "image": "b"},
            {"name": "c" * 64, "image": "b"}, {"image": "x"},
        ])),
        id="containers",
    ),
    pytest.param(_spec(template={"spec": {"containers": _C}}), id="template-without-labels"),
    pytest.param(_spec(template=_template(restartPolicy="Never")), id="restart-policy-never"),
]  # fmt: skip


def _reworded(message: str) -> str:
    """The two upstream texts tally rewords to name its own kind (validation.py docstring)."""
    return message.replace("for deployment", "for podset").replace("in ReplicaSet", "in PodSet")


async def _dry_run_rejection(apps: Any, namespace: str, body: Obj) -> list[str]:
    """What the API server says to creating ``body`` as a ReplicaSet; ``[]`` if it accepts it."""
    try:
        await apps.create_namespaced_replica_set(namespace, copy.deepcopy(body), dry_run="All")
    except client.ApiException as refused:
        if refused.status != 422:
            raise
        return rejection(refused)
    return []


@pytest.mark.parametrize("spec", APPS_V1_CASES)
async def test_validation_matches_apps_v1_replicaset(
    api: client.ApiClient, namespace: str, spec: Obj
) -> None:
    spec = {k: v for k, v in spec.items() if v is not None}
    body = {"metadata": {"name": "rs"}, "spec": spec}
    apps = apps_v1(api)
    upstream = [_reworded(cause) for cause in await _dry_run_rejection(apps, namespace, body)]
    # Go iterates label maps in random order; tally sorts keys. Compare as sets.
    assert sorted(set(upstream)) == sorted(validate_podset(body))


async def test_immutable_selector_matches_apps_v1_replicaset(
    api: client.ApiClient, namespace: str
) -> None:
    old = {"metadata": {"name": "rs"}, "spec": _spec()}
    apps = apps_v1(api)
    await apps.create_namespaced_replica_set(namespace, copy.deepcopy(old))
    new = {"metadata": {"name": "rs"}, "spec": _spec(
        selector={"matchLabels": {"app": "web"},
                  "matchExpressions": [{"key": "app", "operator": "Exists"}]})}  # fmt: skip
    with pytest.raises(client.ApiException) as refused:
        await apps.patch_namespaced_replica_set(
            "rs", namespace, {"spec": {"selector": new["spec"]["selector"]}}, dry_run="All",
            _content_type="application/merge-patch+json",
        )  # fmt: skip
    assert rejection(refused.value) == validate_podset(new, old)
