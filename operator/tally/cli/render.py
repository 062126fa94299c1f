"""How the plugin's reports read: text tables with bars and colour, or JSON and YAML.

Text is for people: on a terminal, bars are drawn in block characters and coloured by how full
(green below 75 %, yellow below 90 %, red from 90 %: the point where the issue's alert fires);
piped or with ``NO_COLOR``, the same layout in plain ASCII, so ``grep`` and ``awk`` work on it.
Columns are padded before colour is added, since escape codes have no width.

JSON and YAML are for programs: quantities in canonical form (as the API server writes them),
percentages as numbers, nothing that depends on the terminal. The field names follow the API's
camelCase.

Pure: reports in, strings out.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import yaml

from tally.cli.status import QuotaUse, ResourceUse, StatusReport
from tally.cli.top import TopReport
from tally.cli.why import Decision, Explanation, QuotaVerdict
from tally.quota.identity import CLUSTER_QUOTA_KIND
from tally.quota.quantity import Quantity

__all__ = [
    "BAR_WIDTH",
    "Style",
    "bar",
    "dump",
    "render_status",
    "render_top",
    "render_why",
    "status_data",
    "top_data",
    "why_data",
]

BAR_WIDTH: Final = 20
WARN_PERCENT: Final = 75.0
FULL_PERCENT: Final = 90.0

_CODES: Final = {
    "bold": "1",
    "dim": "2",
    "red": "31",
    "green": "32",
    "yellow": "33",
}


@dataclass(frozen=True)
class Style:
    """``colour``: ANSI colours and block-character bars (a terminal); otherwise plain ASCII."""

    colour: bool = False

    def paint(self, text: str, *styles: str) -> str:
        if not self.colour or not styles or not text:
            return text
        codes = ";".join(_CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"


PLAIN: Final = Style(colour=False)


def level(percent: float | None, full: bool) -> str:
    """The colour of a use: ``red`` from 90 % (or at a zero limit in use), ``yellow`` from
    75 %, ``green`` below, ``dim`` when unknown."""
    if full:
        return "red"
    if percent is None:
        return "dim"
    if percent >= FULL_PERCENT:
        return "red"
    if percent >= WARN_PERCENT:
        return "yellow"
    return "green"


def bar(percent: float | None, full: bool, style: Style, width: int = BAR_WIDTH) -> str:
    """``[#####...............]`` plain, ``█████░░░…`` on a terminal; a cell per 1/width of
    the limit, rounded down (a bar is full only at 100 %), capped at full."""
    if percent is None and not full:
        filled = 0
    elif percent is None or percent >= 100:
        filled = width
    else:
        filled = min(width, math.floor(percent * width / 100))
    if style.colour:
        return style.paint("█" * filled, level(percent, full)) + style.paint(
            "░" * (width - filled), "dim"
        )
    return "[" + "#" * filled + "." * (width - filled) + "]"


def percent_text(percent: float | None, full: bool) -> str:
    """Whole percent, rounded down so that 100 % means full; ``-`` when unknown, ``full``
    for a zero limit in use."""
    if percent is None:
        return "full" if full else "-"
    return f"{math.floor(percent)}%"


def quantity_text(value: Quantity | None) -> str:
    return "?" if value is None else str(value)


def headroom_text(use: ResourceUse) -> tuple[str, str]:
    """The headroom and its colour: ``700m``, ``0`` (red), ``over by 2`` (red)."""
    headroom = use.headroom
    if headroom is None:
        return "?", "dim"
    if headroom.nanos < 0:
        return f"over by {-headroom}", "red"
    return str(headroom), "red" if headroom.nanos == 0 else ""


Cell = tuple[str, Sequence[str]]
"""A table cell: its text and its styles."""


_ESCAPE: Final = re.compile(r"\x1b\[[0-9;]*m")


def visible_width(text: str) -> int:
    """The columns ``text`` takes on a terminal: escape codes take none."""
    return len(_ESCAPE.sub("", text))


def table(header: Sequence[str], rows: Iterable[Sequence[Cell]], style: Style, indent: str) -> str:
    """Columns padded to their widest cell (two spaces apart); the header dimmed. A cell may
    come painted already (a bar): widths count what shows, not escape codes."""
    body = [list(row) for row in rows]
    all_rows: list[list[Cell]] = [[(h, ("dim",)) for h in header], *body]
    widths = [max(visible_width(row[i][0]) for row in all_rows) for i in range(len(header))]
    lines = []
    for row in all_rows:
        cells = []
        for i, (text, styles) in enumerate(row):
            painted = style.paint(text, *styles) if text else text
            pad = "" if i == len(row) - 1 else " " * (widths[i] - visible_width(text))
            cells.append(painted + pad)
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines)


def pretty(resources: Mapping[str, Quantity]) -> str:
    """``pods=1, requests.cpu=500m`` (sorted), or ``nothing``."""
    return ", ".join(f"{n}={resources[n]}" for n in sorted(resources)) or "nothing"


# -- status --


def _quota_heading(quota: QuotaUse, style: Style) -> str:
    heading = f"{style.paint(quota.kind, 'bold')} {style.paint(quota.title, 'bold')}"
    notes = []
    if quota.scopes:
        notes.append("scopes: " + ", ".join(quota.scopes))
    if quota.kind == CLUSTER_QUOTA_KIND:
        count = quota.namespace_count
        if count is not None:
            notes.append(f"selects {count} namespace{'s' if count != 1 else ''}")
    if quota.problem:
        notes.append(style.paint(f"unreadable: {quota.problem}", "red"))
    return heading + (f"  ({'; '.join(notes)})" if notes else "")


def render_status(report: StatusReport, style: Style = PLAIN) -> str:
    """Each quota: a heading, then per resource used, hard, the bar, the headroom; for a
    ClusterQuota (used and hard are its totals) each bound namespace's share."""
    where = "any namespace" if report.namespaces is None else ", ".join(report.namespaces)
    if not report.quotas:
        return f"No ResourceQuota or ClusterQuota binds {where}.\n"
    blocks = []
    single = report.namespaces is not None and len(report.namespaces) == 1
    for quota in report.quotas:
        header = ["RESOURCE", "USED", "HARD", "USE", "", "HEADROOM"]
        share_of: Mapping[str, Quantity] | None = None
        if quota.kind == CLUSTER_QUOTA_KIND and single and quota.shares:
            share_of = quota.shares[0].used
            header.append(f"IN {quota.shares[0].namespace}")
        rows = []
        for use in quota.resources:
            headroom, headroom_style = headroom_text(use)
            colour = level(use.percent, use.full)
            row: list[Cell] = [
                (use.name, ()),
                (quantity_text(use.used), ()),
                (str(use.hard), ()),
                (bar(use.percent, use.full, style), ()),
                (percent_text(use.percent, use.full).rjust(4), (colour,)),
                (headroom, (headroom_style,) if headroom_style else ()),
            ]
            if share_of is not None:
                row.append((str(share_of.get(use.name, Quantity(0))), ()))
            rows.append(row)
        lines = [_quota_heading(quota, style)]
        if quota.not_computed:
            lines.append(
                "  " + style.paint(f"usage not computed (values may be stale): "
                                   f"{quota.not_computed}", "yellow")
            )  # fmt: skip
        if rows:
            lines.append(table(header, rows, style, "  "))
        else:
            lines.append("  (no limits)")
        if quota.kind == CLUSTER_QUOTA_KIND and share_of is None:
            for share in quota.shares:
                lines.append(f"  in {share.namespace}: {pretty(share.used)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _use_data(use: ResourceUse) -> dict[str, Any]:
    headroom = use.headroom
    percent = use.percent
    return {
        "name": use.name,
        "used": None if use.used is None else str(use.used),
        "hard": str(use.hard),
        "percent": None if percent is None else round(percent, 2),
        "headroom": None if headroom is None else str(headroom),
    }


def _resource_list(values: Mapping[str, Quantity]) -> dict[str, str]:
    return {name: str(values[name]) for name in sorted(values)}


def status_data(report: StatusReport) -> dict[str, Any]:
    quotas = []
    for quota in report.quotas:
        entry: dict[str, Any] = {"kind": quota.kind, "name": quota.name}
        if quota.namespace is not None:
            entry["namespace"] = quota.namespace
        entry["scopes"] = list(quota.scopes)
        entry["resources"] = [_use_data(use) for use in quota.resources]
        if quota.kind == CLUSTER_QUOTA_KIND:
            entry["namespaceCount"] = quota.namespace_count
            entry["namespaces"] = [
                {"namespace": s.namespace, "used": _resource_list(s.used)} for s in quota.shares
            ]
        if quota.problem:
            entry["problem"] = quota.problem
        if quota.not_computed:
            entry["usageNotComputed"] = quota.not_computed
        quotas.append(entry)
    return {
        "namespaces": None if report.namespaces is None else list(report.namespaces),
        "quotas": quotas,
    }


# -- top --


def render_top(report: TopReport, style: Style = PLAIN) -> str:
    resource, namespace = report.resource, report.namespace
    if not report.rows:
        return f"Nothing in {namespace} uses {resource} ({report.counted} objects measured).\n"
    heading = (
        f"{style.paint(resource, 'bold')} in {style.paint(namespace, 'bold')}: "
        f"{report.total} over {report.using} object{'s' if report.using != 1 else ''}"
    )
    if len(report.rows) < report.using:
        heading += f", the top {len(report.rows)}"
    rows = []
    for row in report.rows:
        share = row.usage.nanos * 100 / report.total.nanos if report.total.nanos else 0.0
        rows.append(
            [
                (row.kind, ()),
                (row.name, ("bold",)),
                (str(row.owner) if row.owner else "-", ()),
                (str(row.usage), ()),
                (f"{math.floor(share)}%".rjust(4), ()),
            ]
        )
    text = (
        heading
        + "\n"
        + table(["KIND", "NAME", "OWNER", resource.upper(), "SHARE"], rows, style, "  ")
    )
    return text + "\n"


def top_data(report: TopReport) -> dict[str, Any]:
    return {
        "namespace": report.namespace,
        "resource": report.resource,
        "total": str(report.total),
        "objectsUsing": report.using,
        "objectsMeasured": report.counted,
        "top": [
            {
                "kind": row.kind,
                "name": row.name,
                "owner": None
                if row.owner is None
                else {"kind": row.owner.kind, "name": row.owner.name},
                "usage": str(row.usage),
            }
            for row in report.rows
        ],
        "unmeasured": list(report.unmeasured),
    }


# -- why --


def _verdict_lines(verdict: QuotaVerdict, style: Style) -> list[str]:
    heading = f"{style.paint(verdict.kind, 'bold')} {style.paint(verdict.name, 'bold')}"
    if verdict.scopes:
        heading += (
            "  (scopes: "
            + ", ".join(
                f"{name} {'matches' if matched else 'does not match'}"
                for name, matched in verdict.scopes
            )
            + ")"
        )
    if not verdict.applies:
        return [heading, f"  not charged: {verdict.not_applying}"]
    if verdict.problem:
        return [heading, "  " + style.paint(f"cannot be read: {verdict.problem}", "red")]
    lines = [heading]
    if verdict.failed:
        lines.append("  " + style.paint(f"refuses it: {verdict.failed}", "red"))
    if verdict.unknown:
        lines.append(
            "  "
            + style.paint(
                "refuses it: its use of " + ", ".join(verdict.unknown) + " is not known yet",
                "red",
            )
        )
    if not verdict.charges:
        lines.append("  charged nothing it tracks")
        return lines
    rows = []
    for charge in verdict.charges:
        over = charge.over_by
        after = charge.after
        if after is None:
            result: Cell = ("unknown", ("dim",))
        elif over is not None:
            result = (f"over by {over}", ("red",))
        else:
            result = (f"fits, {charge.hard - after} left", ("green",))
        rows.append(
            [
                (charge.name, ()),
                (quantity_text(charge.used), ()),
                (f"+{charge.requested}", ()),
                (quantity_text(after), ()),
                (str(charge.hard), ()),
                result,
            ]
        )
    lines.append(table(["RESOURCE", "USED", "REQUESTED", "AFTER", "HARD", ""], rows, style, "  "))
    return lines


def render_why(explanation: Explanation, decision: Decision, style: Style = PLAIN) -> str:
    """The usage, each quota's verdict, and the server's decision (the last word)."""
    e = explanation
    lines = [f"{style.paint(e.kind, 'bold')} {style.paint(f'{e.namespace}/{e.name}', 'bold')}"]
    if e.problem:
        lines.append("  " + style.paint(e.problem, "red"))
    elif e.untracked:
        lines.append(f"  {e.untracked}")
    else:
        lines.append(f"  would be charged: {pretty(e.usage)}")
    lines.append("")
    if e.quotas:
        for verdict in e.quotas:
            lines.extend(_verdict_lines(verdict, style))
            lines.append("")
    elif not e.untracked and not e.problem:
        lines.append(f"No quota binding {e.namespace} tracks what it uses.")
        lines.append("")
    if decision.allowed:
        lines.append("Server (dry run): " + style.paint("admitted", "bold", "green"))
        if not e.fits:
            lines.append(
                "  (tally's evaluators predicted a refusal: a quota's use changed since it was "
                "read, or quota admission does not enforce it here)"
            )
    else:
        denial = decision.denial
        assert denial is not None
        who = f" by {denial.kind} {denial.quota}" if denial.quota else ""
        lines.append("Server (dry run): " + style.paint(f"refused{who}", "bold", "red"))
        over = denial.over_by
        if over:
            lines.append(
                "  over by "
                + ", ".join(
                    f"{name}={over[name]} (used {denial.used.get(name, Quantity(0))} + "
                    f"requested {denial.requested.get(name, Quantity(0))} > limited "
                    f"{denial.limited[name]})"
                    for name in sorted(over)
                )
            )
        lines.append(f"  {denial.message}")
    return "\n".join(lines) + "\n"


def _verdict_data(verdict: QuotaVerdict) -> dict[str, Any]:
    data: dict[str, Any] = {
        "kind": verdict.kind,
        "name": verdict.name,
        "tracked": list(verdict.tracked),
        "scopes": [{"scope": name, "matches": matched} for name, matched in verdict.scopes],
        "charged": verdict.applies,
        "fits": verdict.fits,
    }
    if not verdict.applies:
        data["notCharged"] = verdict.not_applying
    if verdict.failed:
        data["failed"] = verdict.failed
    if verdict.unknown:
        data["unknown"] = list(verdict.unknown)
    if verdict.problem:
        data["problem"] = verdict.problem
    data["charges"] = [
        {
            "name": c.name,
            "used": None if c.used is None else str(c.used),
            "requested": str(c.requested),
            "after": None if c.after is None else str(c.after),
            "hard": str(c.hard),
            "overBy": None if c.over_by is None else str(c.over_by),
        }
        for c in verdict.charges
    ]
    return data


def why_data(explanation: Explanation, decision: Decision) -> dict[str, Any]:
    e = explanation
    server: dict[str, Any] = {"allowed": decision.allowed}
    if decision.denial is not None:
        d = decision.denial
        server["message"] = d.message
        if d.quota:
            server["quota"] = {"kind": d.kind, "name": d.quota, "reason": d.reason}
            server["overBy"] = _resource_list(d.over_by)
    data: dict[str, Any] = {
        "object": {"kind": e.kind, "name": e.name, "namespace": e.namespace},
        "usage": _resource_list(e.usage),
        "quotas": [_verdict_data(v) for v in e.quotas],
        "predictedFits": e.fits,
        "server": server,
    }
    if e.untracked:
        data["untracked"] = e.untracked
    if e.problem:
        data["problem"] = e.problem
    return data


def dump(data: Mapping[str, Any], output: str) -> str:
    """``json`` (indented) or ``yaml`` (block style, keys in the order given)."""
    if output == "json":
        return json.dumps(data, indent=2) + "\n"
    return str(yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False))
