"""tally.webhook.limits and the ``TALLY_WEBHOOK_…`` settings that fill them: defaults with the
numbers upstream argues for, bounds that keep the server usable, and the in-flight count."""

from __future__ import annotations

import pytest

from tally.app.recursion import RECURSION_LIMIT
from tally.app.settings import Settings, SettingsError
from tally.webhook.limits import InFlight, WebhookLimits
from tally.webhook.server import MAX_OBJECT_DEPTH, MAX_REVIEW_DEPTH

pytestmark = pytest.mark.unit

MiB = 1024 * 1024


def test_defaults() -> None:
    limits = Settings.from_env({}).webhook_limits
    assert limits == WebhookLimits()
    # controller-runtime's maxRequestSize; kube-apiserver's --max-mutating-requests-inflight.
    assert (7 * MiB, 200) == (limits.max_body_bytes, limits.max_reviews_in_flight)
    # Longer than the API server keeps an idle webhook connection (Go's IdleConnTimeout, 90 s).
    assert limits.keepalive_timeout > 90
    # Room for idle connections beside every review in flight; two of the largest UPDATE
    # reviews (two 1.5 MiB objects each, ~3.5 MiB as JSON) held at once.
    assert limits.max_connections > limits.max_reviews_in_flight
    assert limits.body_budget_bytes >= 2 * 3.5 * MiB


def test_the_settings_fill_the_limits() -> None:
    settings = Settings.from_env(
        {
            "TALLY_WEBHOOK_MAX_BODY_BYTES": "1048576",
            "TALLY_WEBHOOK_BODY_BUDGET_BYTES": "4194304",
            "TALLY_WEBHOOK_MAX_REVIEWS_IN_FLIGHT": "50",
            "TALLY_WEBHOOK_MAX_CONNECTIONS": "64",
            "TALLY_WEBHOOK_TLS_HANDSHAKE_TIMEOUT": "5",
            "TALLY_WEBHOOK_HEADER_TIMEOUT": "3",
            "TALLY_WEBHOOK_BODY_TIMEOUT": "4",
            "TALLY_WEBHOOK_KEEPALIVE_TIMEOUT": "100",
        }
    )
    assert settings.webhook_limits == WebhookLimits(
        max_body_bytes=MiB,
        body_budget_bytes=4 * MiB,
        max_reviews_in_flight=50,
        max_connections=64,
        tls_handshake_timeout=5.0,
        header_timeout=3.0,
        body_timeout=4.0,
        keepalive_timeout=100.0,
    )


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        pytest.param(
            {"TALLY_WEBHOOK_MAX_CONNECTIONS": "0"},
            "TALLY_WEBHOOK_MAX_CONNECTIONS='0'",
            id="no-connections",
        ),
        pytest.param(
            {"TALLY_WEBHOOK_HEADER_TIMEOUT": "0"},
            "TALLY_WEBHOOK_HEADER_TIMEOUT='0'",
            id="no-header-time",
        ),
        pytest.param(
            {"TALLY_WEBHOOK_MAX_BODY_BYTES": "1000"},
            "TALLY_WEBHOOK_MAX_BODY_BYTES='1000'",
            id="body-limit-too-small",
        ),
        pytest.param(
            {"TALLY_WEBHOOK_BODY_BUDGET_BYTES": str(4 * MiB)},
            "must be at least TALLY_WEBHOOK_MAX_BODY_BYTES=7340032",
            id="budget-below-one-body",
        ),
    ],
)
def test_bad_values_name_the_variable(environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError) as error:
        Settings.from_env(environ)
    assert named in str(error.value)


def test_a_budget_smaller_than_one_body_is_refused() -> None:
    with pytest.raises(ValueError, match="smaller than the largest body"):
        WebhookLimits(max_body_bytes=2 * MiB, body_budget_bytes=MiB)


def test_in_flight_counts_reviews_and_bytes_against_their_limits() -> None:
    in_flight = InFlight(max_reviews=2, max_bytes=100)
    assert (True, True, False) == (in_flight.enter(), in_flight.enter(), in_flight.enter())
    in_flight.leave()
    assert in_flight.enter()
    assert (True, True, False) == (in_flight.take(60), in_flight.take(40), in_flight.take(1))
    in_flight.give_back(40)
    assert (False, True) == (in_flight.take(41), in_flight.take(40))
    assert (2, 100) == (in_flight.reviews, in_flight.bytes)


def test_the_recursion_limit_covers_the_deepest_object_copied() -> None:
    # copy.deepcopy takes two frames a level; tally's own call depth needs a few hundred more.
    assert RECURSION_LIMIT >= 2 * MAX_OBJECT_DEPTH + 1000
    assert MAX_REVIEW_DEPTH == MAX_OBJECT_DEPTH + 2
