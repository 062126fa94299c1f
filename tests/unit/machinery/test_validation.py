"""apimachinery's name validation: the messages are upstream's (validation.go, content/*.go,
v0.37.1), copied from its sources, not from tally's output."""

from __future__ import annotations

import pytest

from tally.machinery import validation

pytestmark = pytest.mark.unit

LABEL_REGEX_ERROR = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
SUBDOMAIN_REGEX_ERROR = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
NAME_PART_ERROR = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
    "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used "
    "for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)


@pytest.mark.parametrize("value", ["a", "0", "a-b", "1-2-3", "a" * 63])
def test_dns1123_labels_upstream_accepts(value: str) -> None:
    assert validation.is_dns1123_label(value) == []


@pytest.mark.parametrize(
    ("value", "errors"),
    [
        ("a.b", ["must not contain dots"]),
        ("A", [LABEL_REGEX_ERROR]),
        ("-a", [LABEL_REGEX_ERROR]),
        ("", [LABEL_REGEX_ERROR]),
        ("a" * 64, ["must be no more than 63 characters"]),
    ],
)
def test_dns1123_labels_upstream_refuses(value: str, errors: list[str]) -> None:
    assert validation.is_dns1123_label(value) == errors


def test_dns1123_subdomains() -> None:
    assert validation.is_dns1123_subdomain("example.com") == []
    assert validation.is_dns1123_subdomain("Example.com") == [SUBDOMAIN_REGEX_ERROR]
    assert validation.is_dns1123_subdomain("a" * 254) == ["must be no more than 253 bytes"]


def test_qualified_names() -> None:
    assert validation.is_qualified_name("example.com/MyName") == []
    assert validation.is_qualified_name("my.name_1") == []
    assert validation.is_qualified_name("/a") == ["prefix part must be non-empty"]
    assert validation.is_qualified_name("Example.com/a") == ["prefix part " + SUBDOMAIN_REGEX_ERROR]
    assert validation.is_qualified_name("a/") == ["name part must be non-empty", NAME_PART_ERROR]
    assert validation.is_qualified_name("a" * 64) == ["name part must be no more than 63 bytes"]
    assert validation.is_qualified_name("a/b/c") == [
        "a valid label key must consist of alphanumeric characters, '-', '_' or '.', and must "
        "start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or "
        "'123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') "
        "with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
    ]


def test_label_values() -> None:
    assert validation.is_label_value("") == []
    assert validation.is_label_value("MyValue") == []
    assert validation.is_label_value("a b") == [
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
        "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
        "'my_value',  or '12345', regex used for validation is "
        "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    ]


def test_field_errors_print_as_field_error_does() -> None:
    assert validation.required("spec.selector") == "spec.selector: Required value"
    assert (
        validation.invalid(
            "spec.replicas", validation.show(-1), "must be greater than or equal to 0"
        )
        == "spec.replicas: Invalid value: -1: must be greater than or equal to 0"
    )
    assert validation.show({"b": 1, "a": None}) == '{"a":null,"b":1}'
    assert (
        validation.not_supported("spec.x", "Sometimes", ["Always", "Never"])
        == 'spec.x: Unsupported value: "Sometimes": supported values: "Always", "Never"'
    )
    assert validation.duplicate("spec.k", "a") == 'spec.k: Duplicate value: "a"'
    assert validation.forbidden("spec.k", "may not be set") == "spec.k: Forbidden: may not be set"
