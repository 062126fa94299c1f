"""tally.cli.render: bars, colours, tables and the machine-readable forms.

Expected text is written out by hand: the layout is what a reader (and a script piping the
plain form) relies on.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tally.cli.render import (
    Style,
    bar,
    dump,
    percent_text,
    render_status,
    render_top,
    render_why,
    status_data,
    table,
    visible_width,
    why_data,
)
from tally.cli.status import StatusReport, resource_quota_use, status_report
from tally.cli.top import Owner, TopReport, TopRow
from tally.cli.why import Charge, Decision, Explanation, QuotaVerdict, parse_denial
from tally.quota.quantity import Quantity

pytestmark = pytest.mark.unit

PLAIN = Style(colour=False)
COLOUR = Style(colour=True)


def q(text: str) -> Quantity:
    return Quantity.parse(text)


@pytest.mark.parametrize(
    ("percent", "full", "plain"),
    [
        pytest.param(0.0, False, "[....................]", id="empty"),
        pytest.param(37.5, False, "[#######.............]", id="rounded-down"),
        pytest.param(99.9, False, "[###################.]", id="full-only-at-100"),
        pytest.param(100.0, True, "[####################]", id="full"),
        pytest.param(250.0, True, "[####################]", id="capped"),
        pytest.param(None, True, "[####################]", id="zero-limit-in-use"),
        pytest.param(None, False, "[....................]", id="unknown"),
    ],
)
def test_plain_bar(percent: float | None, full: bool, plain: str) -> None:
    assert plain == bar(percent, full, PLAIN)


@pytest.mark.parametrize(
    ("percent", "colour"),
    [
        pytest.param(74.9, "32", id="green-below-75"),
        pytest.param(75.0, "33", id="yellow-from-75"),
        pytest.param(90.0, "31", id="red-from-90"),
    ],
)
def test_terminal_bar_colour_and_width(percent: float, colour: str) -> None:
    drawn = bar(percent, False, COLOUR)
    assert drawn.startswith(f"\x1b[{colour}m█")
    assert 20 == visible_width(drawn)


@pytest.mark.parametrize(
    ("percent", "full", "text"),
    [
        pytest.param(59.99, False, "59%", id="rounded-down"),
        pytest.param(100.0, True, "100%", id="full"),
        pytest.param(None, True, "full", id="zero-limit-in-use"),
        pytest.param(None, False, "-", id="unknown"),
    ],
)
def test_percent_text(percent: float | None, full: bool, text: str) -> None:
    assert text == percent_text(percent, full)


def test_table_pads_by_what_shows() -> None:
    rows = [[("a", ("red",)), ("1", ())], [("long-name", ()), ("22", ())]]
    plain = table(["NAME", "N"], rows, PLAIN, "  ")
    assert "  NAME       N\n  a          1\n  long-name  22" == plain
    coloured = table(["NAME", "N"], rows, COLOUR, "  ")
    assert "\x1b[31ma\x1b[0m" + " " * 10 + "1" in coloured


REPORT = status_report(
    ["a"],
    [{"metadata": {"name": "demo", "namespace": "a"},
      "status": {"hard": {"pods": "5", "requests.cpu": "1"},
                 "used": {"pods": "5", "requests.cpu": "300m"}}}],
    [{"metadata": {"name": "team"},
      "spec": {"namespaceSelector": {}, "quota": {"hard": {"pods": "10"}}},
      "status": {"total": {"hard": {"pods": "10"}, "used": {"pods": "7"}},
                 "namespaces": [{"namespace": "a", "status": {"used": {"pods": "5"}}},
                                {"namespace": "b", "status": {"used": {"pods": "2"}}}],
                 "namespaceCount": 2}}],
    {"a": {}},
)  # fmt: skip


def test_render_status_plain() -> None:
    assert (
        "ResourceQuota a/demo\n"
        "  RESOURCE      USED  HARD  USE                           HEADROOM\n"
        "  pods          5     5     [####################]  100%  0\n"
        "  requests.cpu  300m  1     [######..............]   30%  700m\n"
        "\n"
        "ClusterQuota team  (selects 2 namespaces)\n"
        "  RESOURCE  USED  HARD  USE                           HEADROOM  IN a\n"
        "  pods      7     10    [##############......]   70%  3         5\n"
    ) == render_status(REPORT, PLAIN)


def test_render_status_all_namespaces_lists_the_shares() -> None:
    cq = {"metadata": {"name": "team"},
          "spec": {"namespaceSelector": {}, "quota": {"hard": {"pods": "10"}}},
          "status": {"total": {"hard": {"pods": "10"}, "used": {"pods": "2"}},
                     "namespaces": [
                         {"namespace": "b", "status": {"used": {"pods": "2"}}}]}}  # fmt: skip
    report = status_report(None, [], [cq], {"a": {}, "b": {}})
    text = render_status(report, PLAIN)
    assert "  in a: nothing\n  in b: pods=2\n" in text


def test_render_status_over_and_unknown() -> None:
    use = resource_quota_use(
        {"metadata": {"name": "x", "namespace": "a"},
         "status": {"hard": {"pods": "1", "services": "1"}, "used": {"pods": "3"}}}
    )  # fmt: skip
    text = render_status(StatusReport(("a",), (use,)), PLAIN)
    assert "  pods      3     1     [####################]  300%  over by 2\n" in text
    assert "  services  ?     1     [....................]     -  ?\n" in text


def test_render_status_nothing_binds() -> None:
    assert "No ResourceQuota or ClusterQuota binds a.\n" == render_status(
        status_report(["a"], [], [], {"a": {}}), PLAIN
    )


def test_status_data_is_plain_json() -> None:
    data = json.loads(dump(status_data(REPORT), "json"))
    assert {
        "namespaces": ["a"],
        "quotas": [
            {"kind": "ResourceQuota", "name": "demo", "namespace": "a", "scopes": [],
             "resources": [
                 {"name": "pods", "used": "5", "hard": "5", "percent": 100.0, "headroom": "0"},
                 {"name": "requests.cpu", "used": "300m", "hard": "1", "percent": 30.0,
                  "headroom": "700m"}]},
            {"kind": "ClusterQuota", "name": "team", "scopes": [],
             "resources": [
                 {"name": "pods", "used": "7", "hard": "10", "percent": 70.0, "headroom": "3"}],
             "namespaceCount": 2, "namespaces": [{"namespace": "a", "used": {"pods": "5"}}]},
        ],
    } == data  # fmt: skip
    assert data == yaml.safe_load(dump(status_data(REPORT), "yaml"))


def test_render_top() -> None:
    report = TopReport(
        "a", "requests.cpu",
        (TopRow("Pod", "big", Owner("PodSet", "web"), q("750m")),
         TopRow("Pod", "small", None, q("250m"))),
        total=q("1250m"), using=3, counted=4,
    )  # fmt: skip
    assert (
        "requests.cpu in a: 1250m over 3 objects, the top 2\n"
        "  KIND  NAME   OWNER       REQUESTS.CPU  SHARE\n"
        "  Pod   big    PodSet/web  750m           60%\n"
        "  Pod   small  -           250m           20%\n"
    ) == render_top(report, PLAIN)


def test_render_why_refused() -> None:
    explanation = Explanation(
        "Pod", "p", "a", {"pods": q("1")},
        (QuotaVerdict("ResourceQuota", "demo", ("pods",), applies=True,
                      charges=(Charge("pods", q("1"), q("5"), q("5")),)),),
    )  # fmt: skip
    denial = parse_denial("exceeded quota: demo, requested: pods=1, used: pods=5, limited: pods=5")
    text = render_why(explanation, Decision(False, denial), PLAIN)
    assert (
        "Pod a/p\n"
        "  would be charged: pods=1\n"
        "\n"
        "ResourceQuota demo\n"
        "  RESOURCE  USED  REQUESTED  AFTER  HARD\n"
        "  pods      5     +1         6      5     over by 1\n"
        "\n"
        "Server (dry run): refused by ResourceQuota demo\n"
        "  over by pods=1 (used 5 + requested 1 > limited 5)\n"
        "  exceeded quota: demo, requested: pods=1, used: pods=5, limited: pods=5\n"
    ) == text
    data = why_data(explanation, Decision(False, denial))
    assert {"kind": "ResourceQuota", "name": "demo", "reason": "exceeded"} == data["server"][
        "quota"
    ]
    assert {"pods": "1"} == data["server"]["overBy"]
    assert data["predictedFits"] is False


def test_render_why_admitted_against_a_prediction() -> None:
    explanation = Explanation(
        "Pod", "p", "a", {"pods": q("1")},
        (QuotaVerdict("ResourceQuota", "demo", ("pods",), applies=True, failed="must specify"),),
    )  # fmt: skip
    text = render_why(explanation, Decision(True), PLAIN)
    assert "Server (dry run): admitted\n  (tally's evaluators predicted a refusal" in text


def test_a_cluster_quota_whose_usage_is_not_computed_says_so() -> None:
    message = "measure 'example.com/replicas': databases.example.com a/bad: no such key: replicas"
    condition = {"type": "UsageComputed", "status": "False", "reason": "EvaluationFailed",
                 "message": message, "lastTransitionTime": "2026-11-26T13:00:00Z"}  # fmt: skip
    cq = {"metadata": {"name": "team"},
          "spec": {"namespaceSelector": {}, "quota": {"hard": {"example.com/replicas": "10"}}},
          "status": {"total": {"hard": {"example.com/replicas": "10"},
                               "used": {"example.com/replicas": "2"}},
                     "conditions": [condition]}}  # fmt: skip
    report = status_report(None, [], [cq], {"a": {}})
    text = render_status(report, PLAIN)
    assert f"ClusterQuota team\n  usage not computed (values may be stale): {message}\n" in text
    assert message == status_data(report)["quotas"][0]["usageNotComputed"]
    # True (or no condition): nothing said.
    cq["status"]["conditions"] = [{**condition, "status": "True"}]
    report = status_report(None, [], [cq], {"a": {}})
    assert "not computed" not in render_status(report, PLAIN)
    assert "usageNotComputed" not in status_data(report)["quotas"][0]
