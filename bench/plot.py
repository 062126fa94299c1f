"""Draw each benchmark's figures as a picture: one panel per figure, tally's bar beside the bar
of what it is compared with (upstream, or a floor), the ratio tally/reference and the target.

Reads what ``bench/_common.py``'s ``write_results`` wrote (``bench/results/<name>.json``) and
writes ``<name>.png`` beside it. Headless (matplotlib's ``Agg`` backend): runs where there is no
display, as the benchmarks do.

Run: ``.venv/bin/python bench/plot.py [JSON ...]`` (default: every ``bench/results/*.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

RESULTS = Path(__file__).resolve().parent / "results"
TALLY_COLOUR = "#1f77b4"
REFERENCE_COLOUR = "#999999"
PANELS_PER_ROW = 4


def ratio_text(figure: dict[str, Any]) -> str:
    """ "tally / upstream = 1.23x" with which way is better, or "" without a reference."""
    reference = figure.get("reference")
    if reference is None:
        return ""
    if reference == 0:
        return f"{figure.get('reference_name', 'upstream')} is 0"
    ratio = figure["tally"] / reference
    better = figure.get("better", "lower")
    return f"tally / {figure.get('reference_name', 'upstream')} = {ratio:.2f}x ({better} is better)"


def value_text(value: float) -> str:
    """A bar's label: three significant digits, no exponent for everyday sizes."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{digits}f}"


def draw(result: dict[str, Any], path: Path) -> None:
    """One picture of ``result`` (a benchmark's JSON document) at ``path``."""
    figures: list[dict[str, Any]] = result.get("figures") or []
    columns = max(1, min(PANELS_PER_ROW, len(figures)))
    rows = max(1, math.ceil(len(figures) / columns))
    canvas, grid = plt.subplots(
        rows, columns, figsize=(max(7.0, 3.4 * columns), 3.3 * rows + 1.0), squeeze=False
    )
    panels = [axes for row in grid for axes in row]
    for axes, figure in zip(panels, figures, strict=False):
        labels = ["tally"]
        values = [float(figure["tally"])]
        colours = [TALLY_COLOUR]
        if figure.get("reference") is not None:
            labels.append(str(figure.get("reference_name", "upstream")))
            values.append(float(figure["reference"]))
            colours.append(REFERENCE_COLOUR)
        bars = axes.bar(labels, values, color=colours, width=0.6)
        axes.bar_label(bars, labels=[value_text(v) for v in values], fontsize=8, padding=2)
        # A figure may be below zero (a growth that was a shrink): the axis then reaches down.
        low, high = min([*values, 0.0]) * 1.25, max([*values, 0.0]) * 1.25
        axes.set_ylim(low, high if high or low else 1.0)
        if low:
            axes.axhline(0, color="black", linewidth=0.6)
        axes.set_ylabel(str(figure["unit"]), fontsize=8)
        axes.set_title(str(figure["name"]), fontsize=9)
        axes.tick_params(labelsize=8)
        notes = [text for text in (ratio_text(figure),) if text]
        if figure.get("target"):
            notes.append(f"target {figure['target']}")
        if notes:
            axes.text(0.5, -0.2, "\n".join(notes), transform=axes.transAxes, ha="center",
                      va="top", fontsize=7.5)  # fmt: skip
    for axes in panels[len(figures) :]:
        axes.set_visible(False)
    when = str(result.get("when", ""))[:10]
    machine = textwrap.fill(str(result.get("machine", "")), width=int(canvas.get_figwidth() * 16))
    canvas.suptitle(f"{result.get('benchmark', path.stem)}, {when}\n{machine}", fontsize=8.5)
    canvas.tight_layout(h_pad=2.5)
    path.parent.mkdir(parents=True, exist_ok=True)
    canvas.savefig(path, dpi=110)
    plt.close(canvas)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="*", type=Path, help="default: bench/results/*.json")
    args = parser.parse_args(argv)
    paths: list[Path] = args.results or sorted(RESULTS.glob("*.json"))
    for path in paths:
        result = json.loads(path.read_text())
        if "figures" not in result:
            print(f"{path}: no figures (a series, or written before "
                  f"bench/_common.write_results), skipped", file=sys.stderr)  # fmt: skip
            continue
        picture = path.with_suffix(".png")
        draw(result, picture)
        print(picture)
    return 0


if __name__ == "__main__":
    sys.exit(main())
