"""``bench/scale.py``'s runs at several sizes, side by side: how each start-up cost grows with
the number of pods.

Every run of ``bench/scale.py`` adds its row (:func:`record`) to
``bench/results/scale-series.json`` (a later run at the same size replaces the row, and each
row keeps its commit and date, so a series mixing code versions says so), then the picture is
drawn again beside it (``scale-series.png``): time from spawn to every quota correct (tally)
and from the first quota create (upstream), to ready, to the end of the start-up burst; RSS of
tally and of kube-controller-manager; quota syncs per quota.

Run: ``.venv/bin/python bench/scale_series.py [--add bench/results/scale.json]`` (redraws;
``--add`` records a run written earlier).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"
SERIES = RESULTS / "scale-series.json"
MIB = 2**20


def row_of(document: dict[str, Any], commit: str) -> dict[str, Any]:
    """The series' row for one ``bench/results/scale.json`` document."""
    tally, upstream = document["tally"], document["upstream"]
    # The start-up's syncs, without the periodic resync a long run reaches (older documents
    # have the final count only).
    syncs = str(tally.get("syncs_in_startup") or tally.get("syncs") or "").split(" ", 1)[0]
    takeover = tally.get("takeover") or {}
    return {
        "pods": document["pods"],
        "namespaces": document["namespaces"],
        "when": document.get("when"),
        "commit": commit,
        "tally_convergence_s": tally.get("convergence_s"),
        "tally_ready_s": tally.get("ready_s"),
        "tally_quiet_s": tally.get("quiet_s"),
        "tally_cluster_quota_s": tally.get("cluster_quota_s"),
        "upstream_convergence_s": upstream.get("convergence_s"),
        "tally_rss_mib": tally["rss"] / MIB,
        "tally_peak_mib": tally["peak"] / MIB,
        "kcm_rss_mib": upstream["kcm_rss"] / MIB,
        "kcm_peak_mib": upstream["kcm_peak"] / MIB,
        "syncs_per_quota": (float(syncs) / document["quotas"])
        if syncs.replace(".", "", 1).isdigit()
        else None,
        "takeover_after_lease_s": (
            takeover["correct_s"] - takeover["lease_s"]
            if takeover.get("correct_s") is not None and takeover.get("lease_s") is not None
            else None
        ),
    }


def current_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=RESULTS.parent, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "?"


def record(document: dict[str, Any], commit: str | None = None) -> Path:
    """Add (or replace, at the same size) ``document``'s row; redraw. Returns the picture."""
    rows = load()
    row = row_of(document, commit or current_commit())
    rows = [r for r in rows if (r["pods"], r["namespaces"]) != (row["pods"], row["namespaces"])]
    rows.append(row)
    rows.sort(key=lambda r: (r["pods"], r["namespaces"]))
    SERIES.write_text(json.dumps({"benchmark": "scale-series", "rows": rows}, indent=2) + "\n")
    return draw(rows, SERIES.with_suffix(".png"))


def load() -> list[dict[str, Any]]:
    if not SERIES.exists():
        return []
    rows: list[dict[str, Any]] = json.loads(SERIES.read_text())["rows"]
    return rows


def draw(rows: list[dict[str, Any]], path: Path) -> Path:
    pods = [r["pods"] for r in rows]
    canvas, (times, memory, syncs) = plt.subplots(1, 3, figsize=(16, 4.8))

    def line(axes: Any, key: str, label: str, style: str) -> None:
        points = [(p, r[key]) for p, r in zip(pods, rows, strict=True) if r.get(key) is not None]
        if points:
            axes.plot(*zip(*points, strict=True), style, label=label)

    line(times, "tally_convergence_s", "tally: every quota correct (from spawn)", "o-")
    line(times, "tally_ready_s", "tally: ready (/readyz)", "s--")
    line(times, "tally_quiet_s", "tally: start-up burst over", "^-")
    line(times, "tally_cluster_quota_s", "tally: ClusterQuota over all correct", "d:")
    line(times, "upstream_convergence_s", "upstream: every quota correct (from create)", "o-")
    times.set(title="start-up", xlabel="pods", ylabel="seconds")
    line(memory, "tally_rss_mib", "tally RSS (settled)", "o-")
    line(memory, "tally_peak_mib", "tally peak RSS", "o--")
    line(memory, "kcm_rss_mib", "kube-controller-manager RSS", "s-")
    line(memory, "kcm_peak_mib", "kube-controller-manager peak", "s--")
    memory.set(title="memory", xlabel="pods", ylabel="MiB")
    line(syncs, "syncs_per_quota", "quota syncs per quota", "o-")
    line(syncs, "takeover_after_lease_s", "takeover: lease to first correct status (s)", "s-")
    syncs.set(title="work per quota; takeover", xlabel="pods")
    for axes in (times, memory, syncs):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
        axes.set_ylim(bottom=0)
        axes.set_xlim(left=0)
    notes = ", ".join(f"{r['pods']:,}: {r['commit']} {str(r.get('when') or '')[:10]}" for r in rows)
    canvas.suptitle(f"bench/scale.py by size (runs: {notes})", fontsize=9)
    canvas.tight_layout()
    canvas.savefig(path, dpi=110)
    plt.close(canvas)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--add", type=Path, action="append", default=[],
                        help="a scale.json to record")  # fmt: skip
    parser.add_argument("--commit", default=None, help="the commit it ran (default: HEAD)")
    args = parser.parse_args(argv)
    for path in args.add:
        print(record(json.loads(path.read_text()), args.commit))
    if not args.add:
        print(draw(load(), SERIES.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
