"""tally.settings: defaults, environment overrides, and clear errors for bad values."""

from __future__ import annotations

import pytest

from tally.settings import Settings, SettingsError

pytestmark = pytest.mark.unit


def test_defaults_are_upstreams() -> None:
    # kube-controller-manager: --resource-quota-sync-period=5m0s,
    # --concurrent-resource-quota-syncs=5.
    settings = Settings.from_env({})
    assert (settings.resync_period, settings.workers) == (300.0, 5)


def test_environment_overrides() -> None:
    settings = Settings.from_env({"TALLY_RESYNC_PERIOD": "2.5", "TALLY_WORKERS": "3"})
    assert (settings.resync_period, settings.workers) == (2.5, 3)


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        pytest.param({"TALLY_WORKERS": "0"}, "TALLY_WORKERS='0'", id="no-workers"),
        pytest.param({"TALLY_WORKERS": "five"}, "TALLY_WORKERS='five'", id="not-a-number"),
        pytest.param({"TALLY_RESYNC_PERIOD": "-1"}, "TALLY_RESYNC_PERIOD='-1'", id="negative"),
        pytest.param({"TALLY_RESYNC_PERIOD": "1e9"}, "TALLY_RESYNC_PERIOD='1e9'", id="absurd"),
        pytest.param({"TALLY_NAMESPACES": "a,B_c"}, "TALLY_NAMESPACES='a,B_c'", id="bad-namespace"),
        # The built-in quota probe's namespace: it ends up in a URL path.
        pytest.param({"TALLY_NAMESPACE": "a/b"}, "TALLY_NAMESPACE='a/b'", id="bad-own-namespace"),
        pytest.param(
            {"TALLY_ALLOW_BUILTIN_QUOTA": "maybe"},
            "TALLY_ALLOW_BUILTIN_QUOTA='maybe'",
            id="allow-not-a-boolean",
        ),
    ],
)
def test_bad_values_name_the_variable(environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match="invalid settings") as error:
        Settings.from_env(environ)
    assert named in str(error.value)


def test_watched_namespaces() -> None:
    assert Settings.from_env({}).watched_namespaces == frozenset()
    assert Settings.from_env({"TALLY_NAMESPACES": " team-a, team-b ,"}).watched_namespaces == {
        "team-a",
        "team-b",
    }


@pytest.mark.parametrize(
    ("environ", "allowed"),
    [
        pytest.param({}, False, id="default-refuses"),
        pytest.param({"TALLY_ALLOW_BUILTIN_QUOTA": "true"}, True, id="true"),
        pytest.param({"TALLY_ALLOW_BUILTIN_QUOTA": "false"}, False, id="false"),
    ],
)
def test_allow_builtin_quota(environ: dict[str, str], allowed: bool) -> None:
    assert allowed == Settings.from_env(environ).allow_builtin_quota
