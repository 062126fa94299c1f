"""tally.app.settings: defaults, environment overrides, and clear errors for bad values."""

from __future__ import annotations

import pytest

from tally.app.settings import Settings, SettingsError

pytestmark = pytest.mark.unit


def test_defaults_are_upstreams() -> None:
    # kube-controller-manager: --resource-quota-sync-period=5m0s,
    # --concurrent-resource-quota-syncs=5.
    settings = Settings.from_env({})
    assert (settings.resync_period, settings.workers) == (300.0, 5)
    assert 20 == settings.missing_usage_workers


def test_environment_overrides() -> None:
    settings = Settings.from_env(
        {"TALLY_RESYNC_PERIOD": "2.5", "TALLY_WORKERS": "3", "TALLY_MISSING_USAGE_WORKERS": "7"}
    )
    assert (settings.resync_period, settings.workers) == (2.5, 3)
    assert 7 == settings.missing_usage_workers


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        pytest.param({"TALLY_WORKERS": "0"}, "TALLY_WORKERS='0'", id="no-workers"),
        pytest.param({"TALLY_WORKERS": "five"}, "TALLY_WORKERS='five'", id="not-a-number"),
        pytest.param(
            {"TALLY_MISSING_USAGE_WORKERS": "0"},
            "TALLY_MISSING_USAGE_WORKERS='0'",
            id="no-missing-usage-workers",
        ),
        pytest.param({"TALLY_API_CONNECTIONS": "0"}, "TALLY_API_CONNECTIONS='0'", id="no-conn"),
        pytest.param(
            {"TALLY_API_CONNECTIONS": "100000"}, "TALLY_API_CONNECTIONS='100000'", id="absurd-conn"
        ),
        pytest.param(
            {"TALLY_API_POOL_RENEWAL_PERIOD": "-60"},
            "TALLY_API_POOL_RENEWAL_PERIOD='-60'",
            id="negative-renewal",
        ),
        pytest.param({"TALLY_RESYNC_PERIOD": "-1"}, "TALLY_RESYNC_PERIOD='-1'", id="negative"),
        pytest.param({"TALLY_RESYNC_PERIOD": "1e9"}, "TALLY_RESYNC_PERIOD='1e9'", id="absurd"),
        pytest.param({"TALLY_NAMESPACES": "a,B_c"}, "TALLY_NAMESPACES='a,B_c'", id="bad-namespace"),
        # The built-in quota probe's namespace: it ends up in a URL path.
        pytest.param({"TALLY_NAMESPACE": "a/b"}, "TALLY_NAMESPACE='a/b'", id="bad-own-namespace"),
        pytest.param(
            {"TALLY_WEBHOOK_URL_PORT": "0"}, "TALLY_WEBHOOK_URL_PORT='0'", id="url-port-zero"
        ),
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


def test_api_connections() -> None:
    assert 16 == Settings.from_env({}).api_connections
    assert 32 == Settings.from_env({"TALLY_API_CONNECTIONS": "32"}).api_connections


def test_api_pool_renewal_period() -> None:
    assert 60.0 == Settings.from_env({}).api_pool_renewal_period
    assert 0.0 == Settings.from_env({"TALLY_API_POOL_RENEWAL_PERIOD": "0"}).api_pool_renewal_period


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


def test_certificate_defaults() -> None:
    # A year for the serving certificate, five for the CA, renewed with a third left.
    policy = Settings.from_env({}).certificate_policy
    assert (policy.validity.days, policy.ca_validity.days) == (365, 5 * 365)
    assert policy.renew_fraction == pytest.approx(1 / 3)
    assert policy.ca_overlap.total_seconds() == 3600


def test_certificate_secret_in_tallys_namespace() -> None:
    settings = Settings.from_env(
        {
            "TALLY_WEBHOOK_CERT_SECRET": "tally-system/tally-webhook-tls",
            "TALLY_NAMESPACE": "tally-system",
        }
    )
    assert settings.webhook_cert_secret_ref == ("tally-system", "tally-webhook-tls")
    assert Settings.from_env(
        {"TALLY_WEBHOOK_CERT_SECRET": "kube-system/tally"}
    ).webhook_cert_secret_ref == ("kube-system", "tally")


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        pytest.param(
            {"TALLY_WEBHOOK_CERT_SECRET": "tally-webhook-tls"},
            "TALLY_WEBHOOK_CERT_SECRET='tally-webhook-tls'",
            id="secret-without-namespace",
        ),
        pytest.param(
            {"TALLY_WEBHOOK_CERT_SECRET": "team-a/tls"},
            "the Secret must be in a namespace tally's webhook exempts",
            id="secret-judged-by-tallys-own-webhook",
        ),
        pytest.param(
            {
                "TALLY_WEBHOOK_CERT_SECRET": "kube-system/tls",
                "TALLY_WEBHOOK_CERT_MOUNT": "/var/run/tally/tls",
            },
            "TALLY_WEBHOOK_CERT_SECRET and TALLY_WEBHOOK_CERT_MOUNT exclude each other",
            id="secret-and-mount",
        ),
        pytest.param(
            {"TALLY_WEBHOOK_CERT_VALIDITY": "100", "TALLY_WEBHOOK_CA_VALIDITY": "50"},
            "TALLY_WEBHOOK_CA_VALIDITY must be at least TALLY_WEBHOOK_CERT_VALIDITY",
            id="ca-shorter-than-serving",
        ),
        pytest.param(
            {"TALLY_WEBHOOK_CA_VALIDITY": "60", "TALLY_WEBHOOK_CERT_VALIDITY": "30"},
            "TALLY_WEBHOOK_CA_OVERLAP=3600 must be shorter than the CA's renewal window",
            id="overlap-outlives-the-old-ca",
        ),
        pytest.param(
            {"TALLY_WEBHOOK_CERT_RENEW_FRACTION": "1"},
            "TALLY_WEBHOOK_CERT_RENEW_FRACTION='1'",
            id="renew-fraction-whole",
        ),
        pytest.param(
            {"TALLY_WEBHOOK_CERT_VALIDITY": "1"},
            "TALLY_WEBHOOK_CERT_VALIDITY='1'",
            id="validity-too-short",
        ),
    ],
)
def test_bad_certificate_settings(environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match="invalid settings") as error:
        Settings.from_env(environ)
    assert named in str(error.value)


def test_leader_election_defaults_are_client_gos() -> None:
    # Off by default (one process: local development, the e2e tests); kube-controller-
    # manager's --leader-elect-lease-duration=15s, --leader-elect-renew-deadline=10s,
    # --leader-elect-retry-period=2s.
    settings = Settings.from_env({})
    assert settings.leader_election is False
    assert (settings.leader_election_lease, settings.lease_namespace) == ("tally", "kube-system")
    config = settings.election_config
    assert (config.lease_duration, config.renew_deadline, config.retry_period) == (15, 10.0, 2.0)


@pytest.mark.parametrize(
    ("environ", "namespace"),
    [
        pytest.param({}, "kube-system", id="nothing-set"),
        pytest.param({"TALLY_NAMESPACE": "tally-system"}, "tally-system", id="own-namespace"),
        pytest.param(
            {"TALLY_NAMESPACE": "tally-system", "TALLY_LEADER_ELECTION_NAMESPACE": "leases"},
            "leases",
            id="explicit",
        ),
    ],
)
def test_lease_namespace(environ: dict[str, str], namespace: str) -> None:
    assert namespace == Settings.from_env(environ).lease_namespace


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        pytest.param(
            {"TALLY_LEADER_ELECTION_RENEW_DEADLINE": "15"},
            "leaseDuration must be greater than renewDeadline",
            id="renew-not-below-lease",
        ),
        pytest.param(
            {"TALLY_LEADER_ELECTION_RETRY_PERIOD": "9"},
            "renewDeadline must be greater than retryPeriod*JitterFactor",
            id="retry-too-long",
        ),
        pytest.param(
            {"TALLY_LEADER_ELECTION_LEASE_DURATION": "1.5"},
            "TALLY_LEADER_ELECTION_LEASE_DURATION='1.5'",
            id="lease-in-whole-seconds",
        ),
        pytest.param(
            {"TALLY_LEADER_ELECTION_LEASE": "Tally"},
            "TALLY_LEADER_ELECTION_LEASE='Tally'",
            id="bad-lease-name",
        ),
    ],
)
def test_bad_leader_election_settings(environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match="invalid settings") as error:
        Settings.from_env(environ)
    assert named in str(error.value)
    if "must be" in named:
        # A rule across the three durations names all three variables.
        assert "TALLY_LEADER_ELECTION_LEASE_DURATION=15" in str(error.value)


# -- TALLY_EXEMPT_NAMESPACES: where tally's webhook never looks


@pytest.mark.parametrize(
    ("environ", "exempt"),
    [
        # As before the setting existed: kube-system, and tally's own namespace when set.
        pytest.param({}, ("kube-system",), id="default"),
        pytest.param(
            {"TALLY_NAMESPACE": "tally-system"}, ("kube-system", "tally-system"), id="own-namespace"
        ),
        pytest.param(
            {
                "TALLY_NAMESPACE": "tally-system",
                "TALLY_EXEMPT_NAMESPACES": " kube-system,cert-manager, calico-system,",
            },
            ("calico-system", "cert-manager", "kube-system", "tally-system"),
            id="add-ons",
        ),
        # tally's own namespace stays exempt whatever the list says.
        pytest.param(
            {"TALLY_NAMESPACE": "tally-system", "TALLY_EXEMPT_NAMESPACES": ""},
            ("tally-system",),
            id="only-its-own",
        ),
        pytest.param(
            {"TALLY_NAMESPACE": "tally-system", "TALLY_EXEMPT_NAMESPACES": "tally-system"},
            ("tally-system",),
            id="named-twice",
        ),
    ],
)
def test_exempt_namespaces(environ: dict[str, str], exempt: tuple[str, ...]) -> None:
    assert exempt == Settings.from_env(environ).webhook_exempt_namespaces


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        pytest.param(
            {"TALLY_EXEMPT_NAMESPACES": "kube-system,Cert_Manager"},
            "TALLY_EXEMPT_NAMESPACES='kube-system,Cert_Manager': Value error, 'Cert_Manager' is "
            "not a valid namespace name",
            id="not-a-namespace",
        ),
        pytest.param(
            {"TALLY_EXEMPT_NAMESPACES": "kube-system,a/b"},
            "'a/b' is not a valid namespace name",
            id="slash",
        ),
        pytest.param(
            {"TALLY_EXEMPT_NAMESPACES": "kube-system," + "a" * 64},
            f"{'a' * 64!r} is not a valid namespace name",
            id="longer-than-a-label",
        ),
        # The built-in quota probe runs in kube-system when TALLY_NAMESPACE is unset.
        pytest.param(
            {"TALLY_EXEMPT_NAMESPACES": "cert-manager"},
            "TALLY_EXEMPT_NAMESPACES='cert-manager': kube-system must stay exempt while "
            "TALLY_NAMESPACE is unset",
            id="probe-namespace-not-exempt",
        ),
        pytest.param(
            {"TALLY_NAMESPACES": "kube-system"},
            "TALLY_NAMESPACES='kube-system': every namespace tally manages is exempt",
            id="manages-only-exempt-namespaces",
        ),
        # The certificate Secret must be in an exempt namespace: kube-system is not any more.
        pytest.param(
            {
                "TALLY_NAMESPACE": "tally-system",
                "TALLY_EXEMPT_NAMESPACES": "cert-manager",
                "TALLY_WEBHOOK_CERT_SECRET": "kube-system/tally",
            },
            "the Secret must be in a namespace tally's webhook exempts (cert-manager, "
            "tally-system;",
            id="secret-no-longer-exempt",
        ),
    ],
)
def test_bad_exempt_namespaces_are_named(environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match="invalid settings") as error:
        Settings.from_env(environ)
    assert named in str(error.value)


def test_certificate_secret_in_an_added_exempt_namespace() -> None:
    settings = Settings.from_env(
        {
            "TALLY_EXEMPT_NAMESPACES": "kube-system,cert-manager",
            "TALLY_WEBHOOK_CERT_SECRET": "cert-manager/tally-webhook-tls",
        }
    )
    assert ("cert-manager", "tally-webhook-tls") == settings.webhook_cert_secret_ref


def test_managed_namespaces_may_include_an_exempt_one() -> None:
    # The selector then names only the others; kube-system alone would select nothing.
    settings = Settings.from_env({"TALLY_NAMESPACES": "team-a,kube-system"})
    assert {"team-a", "kube-system"} == settings.watched_namespaces
    assert ("kube-system",) == settings.webhook_exempt_namespaces


@pytest.mark.parametrize(
    ("environ", "mode"),
    [
        # The default address is every interface: reachable from elsewhere, so authenticated.
        pytest.param({}, "kubernetes", id="default"),
        pytest.param({"TALLY_METRICS_ADDR": "0.0.0.0"}, "kubernetes", id="every-interface"),
        pytest.param({"TALLY_METRICS_ADDR": "::"}, "kubernetes", id="every-interface-v6"),
        pytest.param({"TALLY_METRICS_ADDR": "10.244.1.7"}, "kubernetes", id="pod-address"),
        pytest.param({"TALLY_METRICS_ADDR": "tally.local"}, "kubernetes", id="a-name"),
        # Loopback: only this host reaches it (make run, the e2e tests and benchmarks).
        pytest.param({"TALLY_METRICS_ADDR": "127.0.0.1"}, "none", id="loopback"),
        pytest.param({"TALLY_METRICS_ADDR": "127.1.2.3"}, "none", id="loopback-net"),
        pytest.param({"TALLY_METRICS_ADDR": "::1"}, "none", id="loopback-v6"),
        pytest.param({"TALLY_METRICS_ADDR": "::ffff:127.0.0.1"}, "none", id="loopback-mapped"),
        pytest.param({"TALLY_METRICS_ADDR": "localhost"}, "none", id="localhost"),
        pytest.param({"TALLY_METRICS_ADDR": "LocalHost"}, "none", id="localhost-any-case"),
        # Said outright, whatever the address.
        pytest.param(
            {"TALLY_METRICS_ADDR": "127.0.0.1", "TALLY_METRICS_AUTH": "kubernetes"},
            "kubernetes",
            id="kubernetes-on-loopback",
        ),
        pytest.param(
            {"TALLY_METRICS_ADDR": "0.0.0.0", "TALLY_METRICS_AUTH": "none"},
            "none",
            id="none-on-every-interface",
        ),
        pytest.param(
            {"TALLY_METRICS_ADDR": "0.0.0.0", "TALLY_METRICS_AUTH": "auto"},
            "kubernetes",
            id="auto-said-outright",
        ),
    ],
)
def test_metrics_auth(environ: dict[str, str], mode: str) -> None:
    assert mode == Settings.from_env(environ).metrics_auth_mode


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("Kubernetes", id="case-matters"),
        pytest.param("token", id="unknown"),
        pytest.param("off", id="not-none"),
        pytest.param("", id="empty"),
    ],
)
def test_bad_metrics_auth_is_named(value: str) -> None:
    with pytest.raises(SettingsError, match="invalid settings") as error:
        Settings.from_env({"TALLY_METRICS_AUTH": value})
    assert f"TALLY_METRICS_AUTH={value!r}" in str(error.value)


def test_readiness_defaults_and_overrides() -> None:
    defaults = Settings.from_env({})
    # 8081 is Kopf's liveness endpoint in the image's command; readiness is the next port.
    assert ("0.0.0.0", 8082) == (defaults.readiness_addr, defaults.readiness_port)
    assert (0.1, 5.0, 300.0) == (
        defaults.readiness_max_loop_lag,
        defaults.readiness_window,
        defaults.readiness_timeout,
    )
    settings = Settings.from_env(
        {
            "TALLY_READINESS_PORT": "0",
            "TALLY_READINESS_MAX_LOOP_LAG": "0.25",
            "TALLY_READINESS_WINDOW": "2",
            "TALLY_READINESS_TIMEOUT": "2",
        }
    )
    assert (0, 0.25, 2.0, 2.0) == (
        settings.readiness_port,
        settings.readiness_max_loop_lag,
        settings.readiness_window,
        settings.readiness_timeout,
    )


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        pytest.param(
            {"TALLY_READINESS_MAX_LOOP_LAG": "0"}, "TALLY_READINESS_MAX_LOOP_LAG='0'", id="no-lag"
        ),
        pytest.param({"TALLY_READINESS_WINDOW": "-5"}, "TALLY_READINESS_WINDOW='-5'", id="neg"),
        pytest.param({"TALLY_READINESS_PORT": "70000"}, "TALLY_READINESS_PORT='70000'", id="port"),
        pytest.param(
            {"TALLY_READINESS_WINDOW": "60", "TALLY_READINESS_TIMEOUT": "30"},
            "TALLY_READINESS_WINDOW=60 exceeds TALLY_READINESS_TIMEOUT=30",
            id="window-past-timeout",
        ),
    ],
)
def test_bad_readiness_settings_are_named(environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match="invalid settings") as error:
        Settings.from_env(environ)
    assert named in str(error.value)
