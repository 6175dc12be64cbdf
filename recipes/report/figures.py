"""The report's figures, each as SVG, PNG and PDF, drawn from the report JSON alone.

Figures are built with ``matplotlib.figure.Figure`` (no pyplot, so no global figure state;
PNG goes through the Agg canvas). Output is byte-deterministic: a fixed SVG hash salt, text
as paths, and no dates or software stamps in the metadata, so a rerun is ``identical``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FORMATS = ("svg", "png", "pdf")
METADATA: dict[str, dict[str, Any]] = {
    "svg": {"Date": None},
    "pdf": {"CreationDate": None, "ModDate": None},
    "png": {"Software": None},
}
RC = {"svg.hashsalt": "nscas-report", "svg.fonttype": "path", "font.size": 9,
      "axes.spines.top": False, "axes.spines.right": False}
COLOURS = ("#6b7280", "#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2")
DPI = 120


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def arm_colours(report: dict[str, Any]) -> dict[str, str]:
    """One colour per arm, the same in every figure (the learning table's order first)."""
    names = list(report["learning"]["arms"])
    if report["training"]:
        names += [a for a in report["training"]["arms"] if a not in names]
    return {name: _colour(i) for i, name in enumerate(names)}


def _bars(ax: Any, labels: Sequence[str], values: Sequence[float | None], *, title: str,
          ylabel: str, fmt: str = "{:.2f}", colours: Sequence[str] | None = None) -> None:
    heights = [v or 0.0 for v in values]
    colours = colours or [_colour(i) for i in range(len(labels))]
    bars = ax.bar(range(len(labels)), heights, color=list(colours))
    ax.bar_label(bars, labels=["n/a" if v is None else fmt.format(v) for v in values],
                 fontsize=8, padding=2)
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.margins(y=0.15)


def accuracy_figure(fig: Any, report: dict[str, Any]) -> None:
    """Accuracy of every arm, overall and by task family."""
    arms = report["learning"]["arms"]
    colours = arm_colours(report)
    families = list(next(iter(arms.values()))["by_family"])
    groups = ["all", *families]
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(arms)
    for i, (arm, a) in enumerate(arms.items()):
        values = [a["accuracy"]] + [f["correct"] / f["documents"] for f in a["by_family"].values()]
        xs = [g + (i - (len(arms) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=f"{arm} ({a['correct']}/{a['documents']})",
               color=colours[arm])
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy (exact, strict checker)")
    ax.set_title("Final-test accuracy by arm and task family")
    ax.legend(fontsize=8, frameon=False)


def training_figure(fig: Any, report: dict[str, Any]) -> None:
    """Update time, bytes communicated and loss by arm."""
    arms = report["training"]["arms"]
    names = list(arms)
    colours = arm_colours(report)
    axes = fig.subplots(1, 3)
    _bars(axes[0], names, [a["median_update_seconds"] for a in arms.values()],
          title="Median update", ylabel="seconds", fmt="{:.3g}",
          colours=[colours[n] for n in names])
    per_update = [a["bytes_per_update"] for a in arms.values()]
    unit, scale = _byte_unit(max(per_update))
    _bars(axes[1], names, [b / scale for b in per_update],
          title="Gradient bytes per update", ylabel=f"{unit} (rank 0)", fmt="{:.3g}",
          colours=[colours[n] for n in names])
    for arm, a in arms.items():
        axes[2].plot(range(1, len(a["loss_by_step"]) + 1), a["loss_by_step"], label=arm,
                     color=colours[arm], linewidth=1)
    axes[2].set_title("Training objective")
    axes[2].set_xlabel("update")
    axes[2].set_ylabel("weighted loss")
    axes[2].legend(fontsize=8, frameon=False)


def serving_figure(fig: Any, report: dict[str, Any]) -> None:
    """Throughput and latency by serving phase."""
    phases = report["serving"]["phases"]
    names = list(phases)
    axes = fig.subplots(1, 2)
    _bars(axes[0], names, [p["requests_per_second"] for p in phases.values()],
          title=f"Throughput (pair/single {_num(report['serving']['throughput_ratio'])}x)",
          ylabel="requests per second")
    ax = axes[1]
    for j, key in enumerate(("median_latency_seconds", "p95_latency_seconds")):
        xs = [i + (j - 0.5) * 0.4 for i in range(len(names))]
        ax.bar(xs, [phases[n][key] or 0.0 for n in names], 0.4, color=_colour(j + 1),
               label=key.split("_")[0])
    ax.set_xticks(range(len(names)), names)
    ax.set_title("Latency")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8, frameon=False)


def comparison_figure(fig: Any, report: dict[str, Any]) -> None:
    """The headline panels side by side: accuracy, update time, throughput."""
    panels: list[Callable[[Any], None]] = []
    arms = report["learning"]["arms"]
    colours = arm_colours(report)
    panels.append(lambda ax: _bars(ax, list(arms), [a["accuracy"] for a in arms.values()],
                                   title="Final-test accuracy", ylabel="accuracy",
                                   colours=[colours[n] for n in arms]))
    if report["training"]:
        t = report["training"]["arms"]
        panels.append(lambda ax: _bars(ax, list(t), [a["update_seconds"] for a in t.values()],
                                       title="Sum of update times", ylabel="seconds",
                                       fmt="{:.3g}", colours=[colours[n] for n in t]))
    if report["serving"]:
        s = report["serving"]["phases"]
        panels.append(lambda ax: _bars(ax, list(s),
                                       [p["requests_per_second"] for p in s.values()],
                                       title="Serving throughput", ylabel="requests per second"))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for draw, ax in zip(panels, axes, strict=True):
        draw(ax)


def _byte_unit(largest: float) -> tuple[str, float]:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if largest >= scale:
            return unit, scale
    return "bytes", 1.0


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def write_figures(report: dict[str, Any], out_dir: Path) -> list[str]:
    """Write every figure the report has data for, in every format; the file names."""
    import matplotlib
    from matplotlib.figure import Figure

    figures: list[tuple[str, Callable[[Any, dict[str, Any]], None], tuple[float, float]]] = [
        ("comparison", comparison_figure, (11.0, 3.8)),
        ("accuracy", accuracy_figure, (8.0, 4.2)),
    ]
    if report["training"]:
        figures.append(("training", training_figure, (12.0, 3.8)))
    if report["serving"]:
        figures.append(("serving", serving_figure, (9.0, 3.8)))
    written = []
    with matplotlib.rc_context(RC):
        for name, draw, size in figures:
            fig = Figure(figsize=size, layout="constrained")
            draw(fig, report)
            for fmt in FORMATS:
                fig.savefig(out_dir / f"{name}.{fmt}", format=fmt, dpi=DPI, metadata=METADATA[fmt])
                written.append(f"{name}.{fmt}")
    return written
