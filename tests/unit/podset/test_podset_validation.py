"""PodSet validation (``tally.podset.validation``): the checks of the PodSet webhook.

Cases follow kubernetes ``pkg/apis/apps/validation/validation_test.go`` (TestValidateReplicaSet,
TestValidateReplicaSetUpdate) and name it where they port one. Every expected message is what
the v1.37 API server answered for the same apps/v1 ReplicaSet (``kubectl create --dry-run=server``
on ``hack/cluster.py``'s control plane), with two deliberate rewordings that name our kind:
``empty selector is invalid for podset`` (upstream: ``for deployment``) and
``activeDeadlineSeconds in PodSet is not Supported`` (upstream: ``in ReplicaSet``).
``tests/e2e/test_podset_crd.py`` re-checks the table against a live API server.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tally.podset.validation import invalid_message, validate_podset

pytestmark = pytest.mark.unit

Obj = dict[str, Any]

LABEL_VALUE_REGEX = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
NAME_PART_REGEX = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
PREFIX_REGEX = (
    "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
    "characters, '-' or '.', and must start and end with an alphanumeric character (e.g. "
    "'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_KEY_SLASHES = (
    "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
    "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with "
    "an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
)
DNS_LABEL_REGEX = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def _podset() -> Obj:
    """A valid PodSet, as the API server hands it to the webhook (CRD defaults applied)."""
    return {
        "apiVersion": "tally.dev/v1alpha1",
        "kind": "PodSet",
        "metadata": {"name": "web", "namespace": "default", "generation": 1},
        "spec": {
            "replicas": 3,
            "minReadySeconds": 0,
            "selector": {"matchLabels": {"app": "web"}, "matchExpressions": []},
            "template": {
                "metadata": {"labels": {"app": "web", "tier": "frontend"}},
                "spec": {"containers": [{"name": "nginx", "image": "nginx:1.29"}]},
            },
        },
    }


def _with(change: Callable[[Obj], object]) -> Obj:
    podset = _podset()
    change(podset["spec"])
    return podset


def _set(path: str, value: object) -> Callable[[Obj], None]:
    """Set ``value`` at a dotted path under ``spec``."""

    def change(spec: Obj) -> None:
        *parents, last = path.split(".")
        node = spec
        for part in parents:
            node = node[part]
        node[last] = value

    return change


def _delete(path: str) -> Callable[[Obj], None]:
    def change(spec: Obj) -> None:
        *parents, last = path.split(".")
        node = spec
        for part in parents:
            node = node[part]
        del node[last]

    return change


@pytest.mark.parametrize(
    "podset",
    [
        pytest.param(_podset(), id="TestValidateReplicaSet-success"),
        pytest.param(_with(_set("replicas", 0)), id="zero-replicas"),
        pytest.param(_with(_delete("replicas")), id="replicas-unset-defaults-to-1"),
        pytest.param(_with(_set("minReadySeconds", 30)), id="min-ready-seconds"),
        pytest.param(
            _with(_set("selector", {"matchLabels": {"app": "web"}})),
            id="selector-without-defaults",
        ),
        pytest.param(
            _with(
                _set(
                    "selector",
                    {
                        "matchExpressions": [
                            {"key": "app", "operator": "In", "values": ["web", "api"]},
                            {"key": "tier", "operator": "Exists"},
                            {"key": "canary", "operator": "DoesNotExist", "values": []},
                            {"key": "track", "operator": "NotIn", "values": ["beta"]},
                        ]
                    },
                )
            ),
            id="match-expressions-select-template",
        ),
        pytest.param(
            _with(_set("template.spec.restartPolicy", "Always")), id="restart-policy-always"
        ),
        pytest.param(
            _with(_set("template.spec.restartPolicy", "")), id="restart-policy-empty-defaults"
        ),
        pytest.param(
            _with(_set("template.metadata.labels", {"app": "web", "example.com/x": ""})),
            id="prefixed-label-empty-value",
        ),
        pytest.param(
            _with(_set("template.metadata.annotations", {"Example.COM/Note": "x"})),
            id="annotation-key-checked-lowercased",
        ),
        pytest.param(
            _with(
                _set(
                    "template.spec.containers",
                    [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}],
                )
            ),
            id="two-containers",
        ),
    ],
)
def test_valid_podsets_pass(podset: Obj) -> None:
    assert [] == validate_podset(podset)
    assert [] == validate_podset(podset, copy.deepcopy(podset))


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param(
            _set("replicas", -1),
            ["spec.replicas: Invalid value: -1: must be greater than or equal to 0"],
            id="TestValidateReplicaSet-negative_replicas",
        ),
        pytest.param(
            _set("minReadySeconds", -2),
            ["spec.minReadySeconds: Invalid value: -2: must be greater than or equal to 0"],
            id="negative-min-ready-seconds",
        ),
        pytest.param(
            _set("replicas", "3"),
            ['spec.replicas: Invalid value: "3": must be an integer'],
            id="replicas-not-an-integer",
        ),
        pytest.param(
            _set("selector", {"matchLabels": {}, "matchExpressions": []}),
            ["spec.selector: Invalid value: {}: empty selector is invalid for podset"],
            id="TestValidateReplicaSet-empty-selector",
        ),
        pytest.param(
            _set("selector", {}),
            ["spec.selector: Invalid value: {}: empty selector is invalid for podset"],
            id="empty-selector-without-defaults",
        ),
        pytest.param(
            _delete("selector"),
            [
                "spec.selector: Required value",
                'spec.template.metadata.labels: Invalid value: {"app":"web","tier":"frontend"}: '
                "`selector` does not match template `labels`",
            ],
            id="missing-selector-selects-nothing",
        ),
        pytest.param(
            _set("selector", {"matchLabels": {"app": "api"}}),
            [
                'spec.template.metadata.labels: Invalid value: {"app":"web","tier":"frontend"}: '
                "`selector` does not match template `labels`"
            ],
            id="TestValidateReplicaSet-selector_doesnt_match",
        ),
        pytest.param(
            _set(
                "selector",
                {
                    "matchLabels": {"app": "web"},
                    "matchExpressions": [
                        {"key": "tier", "operator": "NotIn", "values": ["b", "frontend"]}
                    ],
                },
            ),
            [
                'spec.template.metadata.labels: Invalid value: {"app":"web","tier":"frontend"}: '
                "`selector` does not match template `labels`"
            ],
            id="match-expression-excludes-template",
        ),
        pytest.param(
            _delete("template.metadata"),
            [
                "spec.template.metadata.labels: Invalid value: null: "
                "`selector` does not match template `labels`"
            ],
            id="template-without-labels",
        ),
        pytest.param(
            _set("template.metadata.labels", {"app": "web", "replicas": 3}),
            [
                'spec.template.metadata.labels: Invalid value: {"app":"web","replicas":3}: '
                "must be a map of strings"
            ],
            id="template-labels-not-strings",
        ),
        pytest.param(
            _set(
                "selector",
                {
                    "matchLabels": {"b": "-x"},
                    "matchExpressions": [
                        {"key": "app", "operator": "In", "values": []},
                        {"key": "-bad", "operator": "Exists"},
                        {"key": "a", "operator": "Foo", "values": ["a"]},
                        {"key": "b", "operator": "Exists", "values": ["x"]},
                        {"key": "c", "operator": "NotIn", "values": ["-v"]},
                    ],
                },
            ),
            [
                f'spec.selector.matchLabels: Invalid value: "-x": {LABEL_VALUE_REGEX}',
                "spec.selector.matchExpressions[0].values: Required value: "
                "must be specified when `operator` is 'In' or 'NotIn'",
                f'spec.selector.matchExpressions[1].key: Invalid value: "-bad": {NAME_PART_REGEX}',
                'spec.selector.matchExpressions[2].operator: Invalid value: "Foo": '
                "not a valid selector operator",
                "spec.selector.matchExpressions[3].values: Forbidden: "
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                "spec.selector.matchExpressions[4].values[0]: Invalid value: "
                f'"-v": {LABEL_VALUE_REGEX}',
                'spec.selector: Invalid value: {"matchLabels":{"b":"-x"},"matchExpressions":['
                '{"key":"app","operator":"In"},{"key":"-bad","operator":"Exists"},'
                '{"key":"a","operator":"Foo","values":["a"]},'
                '{"key":"b","operator":"Exists","values":["x"]},'
                '{"key":"c","operator":"NotIn","values":["-v"]}]}: invalid label selector',
            ],
            id="invalid-selector-skips-template",
        ),
        pytest.param(
            _set(
                "template.metadata.labels",
                {
                    "app": "web",
                    "-k": "v",
                    "ok": "not valid!",
                    "example.com/": "x",
                    "Bad_Prefix/x": "y",
                    "/a": "b",
                    "a/b/c": "d",
                    "k": "v" * 64,
                },
            ),
            [
                f'spec.template.labels: Invalid value: "-k": {NAME_PART_REGEX}',
                'spec.template.labels: Invalid value: "/a": prefix part must be non-empty',
                f'spec.template.labels: Invalid value: "Bad_Prefix/x": {PREFIX_REGEX}',
                f'spec.template.labels: Invalid value: "a/b/c": {LABEL_KEY_SLASHES}',
                'spec.template.labels: Invalid value: "example.com/": name part must be non-empty',
                f'spec.template.labels: Invalid value: "example.com/": {NAME_PART_REGEX}',
                f'spec.template.labels: Invalid value: "{"v" * 64}": must be no more than 63 bytes',
                f'spec.template.labels: Invalid value: "not valid!": {LABEL_VALUE_REGEX}',
            ],
            id="TestValidateReplicaSet-invalid_label",
        ),
        pytest.param(
            _set("template.metadata.labels", {"app": "web", "q/" + "n" * 64: "x"}),
            [
                f'spec.template.labels: Invalid value: "q/{"n" * 64}": '
                "name part must be no more than 63 bytes"
            ],
            id="label-name-part-too-long",
        ),
        pytest.param(
            _set("template.metadata.annotations", {"-a": "b", "a//b": "x"}),
            [
                f'spec.template.annotations: Invalid value: "-a": {NAME_PART_REGEX}',
                f'spec.template.annotations: Invalid value: "a//b": {LABEL_KEY_SLASHES}',
            ],
            id="TestValidateReplicaSet-invalid_annotation",
        ),
        pytest.param(
            _set("template.metadata.annotations", {"big": "x" * (256 * 1024)}),
            ["spec.template.annotations: Too long: may not be more than 262144 bytes"],
            id="annotations-too-large",
        ),
        pytest.param(
            _set("template.spec.containers", []),
            ["spec.template.spec.containers: Required value"],
            id="TestValidateReplicaSet-invalid_manifest",
        ),
        pytest.param(
            _delete("template.spec"),
            ["spec.template.spec.containers: Required value"],
            id="template-without-pod-spec",
        ),
        pytest.param(
            _set(
                "template.spec.containers",
                [
                    {},
                    {"name": "c", "image": "x"},
                    {"name": "c"},
                    {"name": "Bad_Name", "image": "b"},
                    {"name": "c" * 64, "image": "b"},
                ],
            ),
            [
                "spec.template.spec.containers[0].name: Required value",
                "spec.template.spec.containers[0].image: Required value",
                "spec.template.spec.containers[2].image: Required value",
                'spec.template.spec.containers[2].name: Duplicate value: "c"',
                'spec.template.spec.containers[3].name: Invalid value: "Bad_Name": '
                f"{DNS_LABEL_REGEX}",
                f'spec.template.spec.containers[4].name: Invalid value: "{"c" * 64}": '
                "must be no more than 63 characters",
            ],
            id="containers-name-and-image",
        ),
        pytest.param(
            _set("template.spec.restartPolicy", "OnFailure"),
            [
                'spec.template.spec.restartPolicy: Unsupported value: "OnFailure": '
                'supported values: "Always"'
            ],
            id="TestValidateReplicaSet-invalid_restart_policy_1",
        ),
        pytest.param(
            _set("template.spec.restartPolicy", "Never"),
            [
                'spec.template.spec.restartPolicy: Unsupported value: "Never": '
                'supported values: "Always"'
            ],
            id="TestValidateReplicaSet-invalid_restart_policy_2",
        ),
        pytest.param(
            _set("template.spec.activeDeadlineSeconds", 5),
            [
                "spec.template.spec.activeDeadlineSeconds: Forbidden: "
                "activeDeadlineSeconds in PodSet is not Supported"
            ],
            id="active-deadline-seconds",
        ),
        pytest.param(
            _delete("template"),
            ["spec.template: Required value"],
            id="missing-template",
        ),
    ],
)
def test_invalid_podsets_are_refused_with_upstreams_words(
    change: Callable[[Obj], None], expected: list[str]
) -> None:
    assert expected == validate_podset(_with(change))


def test_errors_come_in_upstream_order() -> None:
    # Server order for the same ReplicaSet: spec fields, selector, template labels, pod spec.
    def change(spec: Obj) -> None:
        spec["replicas"] = -1
        spec["minReadySeconds"] = -2
        spec["selector"] = {"matchLabels": {"app": "x"}}
        spec["template"]["metadata"]["labels"] = {"app": "web", "tier": "a"}
        spec["template"]["spec"] = {
            "restartPolicy": "OnFailure",
            "activeDeadlineSeconds": 5,
            "containers": [],
        }

    assert [
        "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
        "spec.minReadySeconds: Invalid value: -2: must be greater than or equal to 0",
        'spec.template.metadata.labels: Invalid value: {"app":"web","tier":"a"}: '
        "`selector` does not match template `labels`",
        "spec.template.spec.containers: Required value",
        'spec.template.spec.restartPolicy: Unsupported value: "OnFailure": '
        'supported values: "Always"',
        "spec.template.spec.activeDeadlineSeconds: Forbidden: "
        "activeDeadlineSeconds in PodSet is not Supported",
    ] == validate_podset(_with(change))


@pytest.mark.parametrize(
    ("new_selector", "expected"),
    [
        pytest.param(
            {"matchLabels": {"app": "web", "tier": "frontend"}},
            [
                'spec.selector: Invalid value: {"matchLabels":{"app":"web","tier":"frontend"}}: '
                "field is immutable"
            ],
            id="TestValidateReplicaSetUpdate-selector-changed",
        ),
        pytest.param(
            {
                "matchLabels": {"app": "web"},
                "matchExpressions": [{"key": "a", "operator": "Exists"}],
            },
            [
                'spec.template.metadata.labels: Invalid value: {"app":"web","tier":"frontend"}: '
                "`selector` does not match template `labels`",
                'spec.selector: Invalid value: {"matchLabels":{"app":"web"},"matchExpressions":'
                '[{"key":"a","operator":"Exists"}]}: field is immutable',
            ],
            id="expression-added",
        ),
        pytest.param({"matchLabels": {"app": "web"}}, [], id="absent-list-equals-empty"),
        pytest.param(
            {"matchLabels": {"app": "web"}, "matchExpressions": None}, [], id="null-equals-empty"
        ),
    ],
)
def test_selector_is_immutable(new_selector: Obj, expected: list[str]) -> None:
    old = _podset()
    new = _with(_set("selector", new_selector))
    assert expected == validate_podset(new, old)


@pytest.mark.parametrize(
    ("old_expression", "new_expression", "changed"),
    [
        pytest.param(
            {"key": "a", "operator": "Exists"},
            {"key": "a", "operator": "Exists", "values": []},
            False,
            id="values-absent-equals-empty",
        ),
        pytest.param(
            {"key": "app", "operator": "In", "values": ["web", "api"]},
            {"key": "app", "operator": "In", "values": ["api", "web"]},
            True,
            id="values-order-counts",
        ),
        pytest.param(
            {"key": "app", "operator": "In", "values": ["web"]},
            {"key": "app", "operator": "NotIn", "values": ["web"]},
            True,
            id="operator-changed",
        ),
    ],
)
def test_selector_compared_semantically(
    old_expression: Obj, new_expression: Obj, changed: bool
) -> None:
    # apiequality.Semantic.DeepEqual: nil and empty are equal, list order is not ignored.
    old = _with(_set("selector", {"matchExpressions": [old_expression]}))
    new = _with(_set("selector", {"matchExpressions": [new_expression]}))
    errors = [e for e in validate_podset(new, old) if e.endswith(": field is immutable")]
    assert changed == bool(errors)


def test_scaling_and_template_changes_are_allowed_on_update() -> None:
    old = _podset()
    new = _podset()
    new["spec"]["replicas"] = 10
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "nginx:1.30"
    new["spec"]["template"]["metadata"]["labels"]["track"] = "stable"
    assert [] == validate_podset(new, old)


def test_duplicate_messages_are_reported_once() -> None:
    # ErrorList.ToAggregate drops repeats: two invalid annotation keys with one message each.
    podset = _with(_set("template.metadata.annotations", {"-a": "x", "-A": "y"}))
    assert [
        f'spec.template.annotations: Invalid value: "-A": {NAME_PART_REGEX}',
        f'spec.template.annotations: Invalid value: "-a": {NAME_PART_REGEX}',
    ] == validate_podset(podset)


@pytest.mark.parametrize(
    "podset",
    [
        pytest.param({}, id="no-spec"),
        pytest.param({"spec": []}, id="spec-not-an-object"),
        pytest.param({"spec": {"selector": "app=web"}}, id="selector-a-string"),
        pytest.param({"spec": {"selector": {"matchExpressions": "x"}}}, id="expressions-string"),
        pytest.param({"spec": {"selector": {"matchExpressions": [1]}}}, id="expression-number"),
        pytest.param(
            {"spec": {"selector": {"matchLabels": {"a": "b"}}, "template": []}},
            id="template-a-list",
        ),
        pytest.param(
            {
                "spec": {
                    "selector": {"matchLabels": {"a": "b"}},
                    "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [1]}},
                }
            },
            id="container-a-number",
        ),
    ],
)
def test_malformed_input_is_reported_not_raised(podset: Obj) -> None:
    errors = validate_podset(podset)
    assert errors
    assert all(error.startswith("spec") for error in errors)


@pytest.mark.parametrize(
    ("errors", "expected"),
    [
        pytest.param(
            ["spec.replicas: Invalid value: -1: must be greater than or equal to 0"],
            'PodSet.tally.dev "web" is invalid: '
            "spec.replicas: Invalid value: -1: must be greater than or equal to 0",
            id="one-error",
        ),
        pytest.param(
            ["spec.selector: Required value", "spec.template: Required value"],
            'PodSet.tally.dev "web" is invalid: '
            "[spec.selector: Required value, spec.template: Required value]",
            id="an-aggregate",
        ),
    ],
)
def test_invalid_message_reads_like_the_api_server(errors: list[str], expected: str) -> None:
    assert expected == invalid_message("web", errors)


def test_the_example_podset_is_valid() -> None:
    # crds/examples/20-podset.yaml: what users apply first must pass the webhook.
    path = Path(__file__).resolve().parents[3] / "crds" / "examples" / "20-podset.yaml"
    body = yaml.safe_load(path.read_text())
    assert [] == validate_podset(body)
    assert (3, "tally-demo") == (body["spec"]["replicas"], body["metadata"]["namespace"])
