"""The Grafana dashboard and the alert rules in ``deploy/``, checked by a real Prometheus.

* ``promtool check rules`` and ``promtool test rules`` (one firing and one silent case per
  alert, ``deploy/prometheus/tally-rules.test.yaml``);
* the PrometheusRule carries exactly the rule file's groups;
* every metric name the dashboard and the rules use is one tally exports;
* Prometheus (Debian's package, installed by ``make prometheus``: ``hack/prometheus.sh``)
  scrapes a running tally on loopback, after a quota, a few pod creates and one denial, and
  answers every dashboard query, every variable query and every alert expression without
  error; those that describe what this test made happen return series, and the webhook
  certificate's expiry is the notAfter of the certificate tally's webhook port presents.

Nothing here skips: a missing ``prometheus`` or ``promtool`` fails the test.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import shutil
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from cryptography import x509
from kubernetes_asyncio import client

import cluster
from builders import pod
from tally.app.metrics import Metrics
from tally_e2e import RunningOperator, eventually

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "tally.json"
RULES = REPO / "deploy" / "prometheus" / "tally-rules.yaml"
PROMETHEUS_RULE = REPO / "deploy" / "prometheus" / "tally-prometheusrule.yaml"
RULES_TEST = REPO / "deploy" / "prometheus" / "tally-rules.test.yaml"

JOB = "tally"
WEBHOOK_CONFIGURATION = "tally.dev"
CERTIFICATE_EXPIRY = "tally_webhook_certificate_expiry_timestamp_seconds"
EXPIRING_WITHIN = "7 * 24 * 3600"
# Wide enough for several 1 s scrapes on a busy machine, short enough that the traffic of this
# test is inside it.
RATE_INTERVAL = "1m"
PODS_HARD = 3
PROMETHEUS_START_TIMEOUT_S = 60.0

# Series the dashboard may show empty here, and why; every other dashboard query must return
# series once tally has been scraped after this test's traffic.
MAY_BE_EMPTY = {
    "tally_clusterquota_usage": "this test creates no ClusterQuota",
    "tally_clusterquota_namespace_usage": "this test creates no ClusterQuota",
    "tally_clusterquota_status_condition": "this test creates no ClusterQuota",
    "tally_admission_charges_released_total": "a charge is released only if its object fails",
}


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: run `make prometheus` (hack/prometheus.sh)")
    return path


def dashboard_targets() -> list[tuple[str, str]]:
    """(panel title, expr) of every query in the dashboard, rows' nested panels included."""
    found: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            found.extend((panel["title"], t["expr"]) for t in panel.get("targets", []))
            walk(panel.get("panels", []))

    walk(json.loads(DASHBOARD.read_text())["panels"])
    return found


def dashboard_variables() -> dict[str, str]:
    """name → query of every Prometheus query variable (``label_values(…)``)."""
    templating = json.loads(DASHBOARD.read_text())["templating"]["list"]
    return {v["name"]: v["query"]["query"] for v in templating if v["type"] == "query"}


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variables replaced: ``$__rate_interval`` by a duration, the dashboard's own
    variables by ``values`` (a real value) or ``.*`` (Grafana's "All" for these variables)."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), ".*"), expr)


def exported_names() -> set[str]:
    """Every series name tally's registry can export (histograms' and counters' suffixes)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in Metrics().registry.collect()
        for suffix in suffixes[family.type]
    }


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: tally's families all start with these prefixes."""
    return set(re.findall(r"\b(?:tally|kube|workqueue)_\w+", expr))


# -- the files, with promtool


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_unit_tests_of_the_alerts_pass() -> None:
    result = subprocess.run(
        [binary("promtool"), "test", "rules", RULES_TEST.name],
        cwd=RULES_TEST.parent,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (firing if check["exp_alerts"] else silent).add(check["alertname"])
    alerts = {rule["alert"] for rule in alert_rules()}
    assert alerts == firing
    assert alerts <= silent


def test_the_prometheusrule_carries_the_rule_files_groups() -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert ("monitoring.coreos.com/v1", "PrometheusRule") == (rule["apiVersion"], rule["kind"])
    assert yaml.safe_load(RULES.read_text())["groups"] == rule["spec"]["groups"]


def test_dashboard_and_rules_use_only_metrics_tally_exports() -> None:
    exported = exported_names()
    exprs = [expr for _, expr in dashboard_targets()]
    exprs += list(dashboard_variables().values())
    exprs += [rule["expr"] for rule in alert_rules()]
    used = set().union(*(metric_names(expr) for expr in exprs))
    assert used - exported == set()
    # Each MAY_BE_EMPTY entry names a real series the dashboard shows.
    assert set(MAY_BE_EMPTY) <= used


# -- a real Prometheus scraping a running tally


@pytest.fixture(scope="module")
def prometheus(
    operator: RunningOperator, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """Prometheus on loopback scraping ``operator`` every second, with tally's alert rules
    loaded; yields its base URL."""
    directory = tmp_path_factory.mktemp("prometheus")
    target = urllib.parse.urlsplit(operator.metrics_url)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": JOB,
                "metrics_path": target.path,
                "static_configs": [{"targets": [target.netloc]}],
            }
        ],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = cluster.free_port()
    url = f"http://127.0.0.1:{port}"
    log = directory / "prometheus.log"
    command = [
        binary("prometheus"),
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + PROMETHEUS_START_TIMEOUT_S
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"Prometheus never became ready:\n{log.read_text(errors='replace')}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


async def api_get(url: str, path: str, **params: str) -> Any:
    """``GET`` a Prometheus HTTP API path; fails the test on an error answer."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{url}{path}", params=params) as response,
    ):
        body = await response.json()
    assert body["status"] == "success", f"{path} {params}: {body}"
    return body["data"]


async def query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result; fails the test if Prometheus cannot evaluate it."""
    data = await api_get(url, "/api/v1/query", query=expr)
    assert data["resultType"] == "vector", f"{expr}: {data}"
    return list(data["result"])


async def served_certificate(api: client.ApiClient, operator: RunningOperator) -> x509.Certificate:
    """The certificate tally's webhook port presents, found through the webhook configuration
    tally registered (the handshake checks nothing: only the certificate is wanted)."""
    response = await client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(
        WEBHOOK_CONFIGURATION, _preload_content=False
    )
    configuration = json.loads(await response.read())
    # Every webhook of the configuration is served on one port (at its own path).
    (address,) = {
        urllib.parse.urlsplit(w["clientConfig"]["url"]).netloc for w in configuration["webhooks"]
    }
    target = urllib.parse.urlsplit(f"https://{address}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if operator.webhook_client is not None:
        context.load_cert_chain(*operator.webhook_client)
    _, writer = await asyncio.open_connection(target.hostname, target.port, ssl=context)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der)


async def _quota_used(api: client.ApiClient, namespace: str) -> dict[str, str]:
    quota = await client.CoreV1Api(api).read_namespaced_resource_quota("pods", namespace)
    return dict((api.sanitize_for_serialization(quota).get("status") or {}).get("used") or {})


async def test_prometheus_answers_every_dashboard_query_and_alert_expression(
    prometheus: str, api: client.ApiClient, namespace: str, operator: RunningOperator
) -> None:
    await eventually(
        lambda: query(prometheus, f'up{{job="{JOB}"}} == 1'),
        until=bool,
        what="Prometheus's first successful scrape of tally",
    )

    # Traffic: a quota for PODS_HARD pods, PODS_HARD pods charged by admission, and one more
    # pod, denied. kube_resourcequota follows the quota's status as written, by admission's
    # charges too, not only the controller's syncs.
    core = client.CoreV1Api(api)
    await core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": str(PODS_HARD)}}}
    )
    await eventually(
        lambda: _quota_used(api, namespace),
        until=lambda used: used == {"pods": "0"},
        within=10,
        what="the quota's first status",
    )
    for i in range(PODS_HARD):
        await core.create_namespaced_pod(namespace, pod(f"p{i}", container_name="app"))
    with pytest.raises(client.ApiException) as denied:
        await core.create_namespaced_pod(namespace, pod("one-too-many", container_name="app"))
    assert 403 == denied.value.status

    # Scraped after the traffic: the quota full, the denial counted.
    quota_used = (
        f'kube_resourcequota{{job="{JOB}", namespace="{namespace}", resource="pods", type="used"}}'
    )
    await eventually(
        lambda: query(prometheus, quota_used),
        until=lambda result: [r["value"][1] for r in result] == [str(PODS_HARD)],
        what=f"{quota_used} == {PODS_HARD}",
    )
    # The denial's series is new: a rate over it needs two scrapes of it.
    denials = f'tally_admission_requests_total{{job="{JOB}", resource="pods", result="forbidden"}}'
    await eventually(
        lambda: query(prometheus, f"count_over_time({denials}[{RATE_INTERVAL}]) >= 2"),
        until=bool,
        what="the denial scraped twice",
    )
    assert ["1"] == [r["value"][1] for r in await query(prometheus, denials)]
    # Every rule evaluated at least once since the traffic was scraped (1 s evaluation).
    scraped = time.time()

    async def rules() -> list[dict[str, Any]]:
        groups = (await api_get(prometheus, "/api/v1/rules"))["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def evaluated_after_scrape(loaded: list[dict[str, Any]]) -> bool:
        return len(loaded) == len(alert_rules()) and all(
            datetime.datetime.fromisoformat(rule["lastEvaluation"]).timestamp() > scraped
            for rule in loaded
        )

    loaded = await eventually(rules, until=evaluated_after_scrape, what="rules evaluated")
    assert {rule["alert"]: "ok" for rule in alert_rules()} == {
        rule["name"]: rule["health"] for rule in loaded
    }, loaded

    # The dashboard's variables, then every panel query with the variables set to this
    # test's job and namespace ("All" for the rest).
    variables = dashboard_variables()
    values = {"job": JOB, "namespace": namespace}
    label_values = re.compile(r"label_values\((.+),\s*(\w+)\)")
    for name, definition in variables.items():
        match = label_values.fullmatch(substitute(definition, values))
        assert match is not None, definition
        selector, label = match.groups()
        found = await api_get(prometheus, f"/api/v1/label/{label}/values", **{"match[]": selector})
        if name in values:
            assert values[name] in found, (definition, found)

    results: dict[str, list[dict[str, Any]]] = {}
    for title, expr in dashboard_targets():
        concrete = substitute(expr, values)
        result = await query(prometheus, concrete)
        results[concrete] = result
        if not metric_names(expr) & set(MAY_BE_EMPTY):
            assert result, f"panel {title!r}: no series for {concrete}"

    # The quota panel shows this test's full quota: PODS_HARD used of PODS_HARD.
    quota_panel = next(expr for title, expr in dashboard_targets() if "ResourceQuota use" in title)
    shown = {
        r["metric"]["resource"]: float(r["value"][1])
        for r in results[substitute(quota_panel, values)]
        if r["metric"]["resourcequota"] == "pods"
    }
    assert {"pods": 1.0} == shown

    # Every alert expression evaluates; the quota alert's condition holds for this test's full
    # quota, and the process leads (no leader election in the e2e tests), so no-leader is empty.
    for rule in alert_rules():
        result = await query(prometheus, rule["expr"])
        if rule["alert"] == "TallyResourceQuotaNearlyFull":
            assert any(
                (r["metric"]["namespace"], r["metric"]["resource"]) == (namespace, "pods")
                for r in result
            ), result
        if rule["alert"] == "TallyNoLeader":
            assert [] == result
        if rule["alert"] == "TallyWebhookCertificateExpiring":
            # tally made its certificate at start-up, valid for a year: not expiring.
            assert [] == result

    # The expiry is the end of the certificate the webhook port presents, to the second.
    served = await served_certificate(api, operator)
    exported = await query(prometheus, f'{CERTIFICATE_EXPIRY}{{job="{JOB}"}}')
    assert [served.not_valid_after_utc.timestamp()] == [float(r["value"][1]) for r in exported]
    # The alert's expression selects that series once its window is wider than the time
    # left, with the time left as its value (what the alert's summary shows).
    (expiring,) = [r for r in alert_rules() if r["alert"] == "TallyWebhookCertificateExpiring"]
    assert EXPIRING_WITHIN in expiring["expr"]
    widened = expiring["expr"].replace(EXPIRING_WITHIN, "2 * 365 * 24 * 3600")
    asked = time.time()
    result = await query(prometheus, widened)
    assert [JOB] == [r["metric"]["job"] for r in result]
    left = served.not_valid_after_utc.timestamp() - asked
    assert abs(float(result[0]["value"][1]) - left) < 5.0, (result, left)
