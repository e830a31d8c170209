"""The demo's chart: a PNG of the same comparison the demo prints, drawn with matplotlib.

``podcost demo`` calls :func:`require_matplotlib` before it starts anything and :func:`draw`
at the end. matplotlib is the ``demo`` extra (the services do not need it), so it is imported
here, lazily, with the Agg backend (no display needed).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from podcost.commands.demo_compare import Comparison, skew

#: Bar colours: before, without podcost, with podcost.
_COLOURS = ("#9e9e9e", "#e4572e", "#2e86ab")
_SERIES = ("before", "without podcost", "with podcost")


class ChartUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to get it."""


def require_matplotlib() -> None:
    """Raise ``ChartUnavailable`` unless matplotlib can be imported."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ChartUnavailable(
            "matplotlib is missing: install the demo extra "
            "(`uv sync --extra demo`, or `pip install 'podcost[demo]'`)"
        )


def _bars(axes: Any, title: str, series: Sequence[Mapping[str, int]]) -> None:
    keys = sorted({key for counts in series for key in counts})
    width = 0.8 / len(series)
    for index, (label, counts, colour) in enumerate(zip(_SERIES, series, _COLOURS, strict=True)):
        positions = [slot + (index - (len(series) - 1) / 2) * width for slot in range(len(keys))]
        bars = axes.bar(positions, [counts.get(key, 0) for key in keys], width,
                        label=label, color=colour)  # fmt: skip
        axes.bar_label(bars, padding=2, fontsize=8)
    axes.set_xticks(range(len(keys)), keys)
    axes.set_ylabel("pods")
    axes.set_title(title, fontsize=10)
    axes.set_ylim(0, max(max(counts.values(), default=0) for counts in series) + 2)
    axes.spines[["top", "right"]].set_visible(False)


def draw(comparisons: Sequence[Comparison], path: Path) -> Path:
    """Draw ``comparisons`` (one row of two panels per workload) into the PNG at ``path``."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = len(comparisons)
    figure, grid = plt.subplots(rows, 2, figsize=(11, 3.6 * rows + 1.2), squeeze=False)
    try:
        for row, comparison in zip(grid, comparisons, strict=True):
            without, ours = comparison.without, comparison.with_podcost
            _bars(
                row[0],
                f"{comparison.workload} [{comparison.strategies}]: pods per zone\n"
                f"zone skew {skew(comparison.zones_before)} → {without.zone_skew} without "
                f"podcost, → {ours.zone_skew} with",
                [comparison.zones_before, without.zones_after, ours.zones_after],
            )
            spot_before = comparison.capacity_before.get("spot", 0)
            _bars(
                row[1],
                f"{comparison.workload}: pods per capacity type\n"
                f"spot pods {spot_before} → {without.capacity_after.get('spot', 0)} without "
                f"podcost, → {ours.capacity_after.get('spot', 0)} with",
                [comparison.capacity_before, without.capacity_after, ours.capacity_after],
            )
        grid[0][0].legend(loc="upper right", fontsize=8)
        replicas = {(c.replicas_before, c.replicas_after) for c in comparisons}
        scale = ", ".join(f"{before} → {after}" for before, after in sorted(replicas))
        figure.suptitle(f"podcost demo: scale-in {scale}, the same pods without and with podcost")
        figure.text(
            0.5, 0.01,
            "without podcost: the ReplicaSet victim model on the same pods with no deletion costs; "
            "with podcost: the pods the real kube-controller-manager deleted",
            ha="center", fontsize=8, color="#555555",
        )  # fmt: skip
        figure.tight_layout(rect=(0, 0.03, 1, 0.97))
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)
    return path
