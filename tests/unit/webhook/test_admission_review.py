"""tally.webhook.server: the AdmissionReview envelope is checked before a handler sees it."""

from __future__ import annotations

import json

import pytest

from tally.webhook.server import ReviewError, parse_review

pytestmark = pytest.mark.unit

VALID = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "1",
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "userInfo": {"username": "alice"},
        "object": {"metadata": {"name": "p"}},
        "extraFieldFromANewerServer": True,
    },
}


def test_a_valid_review_passes_through_unchanged() -> None:
    assert parse_review(json.dumps(VALID).encode()) == VALID


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b"\xff\xfe", "the body is not UTF-8 text", id="not-utf8"),
        pytest.param(b"{", "the body is not JSON", id="not-json"),
        pytest.param(b"[]", "body: Input should be a valid dictionary", id="array"),
        pytest.param(b"{}", "apiVersion: Field required", id="empty"),
        pytest.param(
            json.dumps({**VALID, "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
            "apiVersion: Input should be 'admission.k8s.io/v1'",
            id="old-version",
        ),
        pytest.param(
            json.dumps({**VALID, "request": {**VALID["request"], "resource": None}}).encode(),
            "request.resource: Input should be a valid dictionary",
            id="no-resource",
        ),
        pytest.param(
            json.dumps({**VALID, "request": {**VALID["request"], "object": None}}).encode(),
            "request.object and request.oldObject are both missing",
            id="no-object",
        ),
    ],
)
def test_bad_bodies_name_the_problem(body: bytes, message: str) -> None:
    with pytest.raises(ReviewError) as error:
        parse_review(body)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "number",
    [
        pytest.param(2**64 + 1, id="integer-past-64-bits"),
        pytest.param(10**400, id="integer-past-a-double"),
    ],
)
def test_large_integers_are_read_exactly(number: int) -> None:
    # A custom resource may hold any JSON number and the API server stores what it was sent;
    # a faster parser that turns these into floats (orjson) would charge a rounded figure.
    review = {**VALID, "request": {**VALID["request"], "object": {"spec": {"size": number}}}}
    parsed = parse_review(json.dumps(review).encode())
    assert parsed["request"]["object"]["spec"]["size"] == number
