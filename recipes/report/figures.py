"""The report's figures: first their data (report.json's ``figures`` part), then each drawn
from that data alone as SVG, PNG and PDF, with the same data embedded in the file.

``figure_data`` says exactly what each figure draws: per panel its kind (``bars``,
``grouped`` or ``lines``), its title and axis labels, and every series with its values, the
texts written on the bars and the colours. ``draw`` reads nothing else, so the data is the
figure; a verifier recomputes the data from the retained evidence and compares it with
report.json and with the copy in each file: the canonical JSON of
``{"format": FIGURE_FORMAT, "figure": name, "data": ...}`` (sorted keys, no spaces, ASCII)
in the SVG's Dublin Core ``<dc:description>``, the PNG's ``tEXt`` chunk ``nscas-figure``
and the PDF's document-information ``/Subject``.

Figures are built with ``matplotlib.figure.Figure`` (no pyplot, so no global figure state).
Output is byte-deterministic: a fixed SVG hash salt, text as paths, and no dates or software
stamps in the metadata, so a rerun is ``identical``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIGURE_FORMAT = "nscas-figure/1"
FORMATS = ("svg", "png", "pdf")
PNG_KEY = "nscas-figure"
RC = {"svg.hashsalt": "nscas-report", "svg.fonttype": "path", "font.size": 9,
      "axes.spines.top": False, "axes.spines.right": False}
COLOURS = ("#6b7280", "#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2")
RANK_STYLES = ("-", "--", ":", "-.")
DPI = 120


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def arm_colours(report: dict[str, Any]) -> dict[str, str]:
    """One colour per arm, the same in every figure (the learning table's order first)."""
    names = list(report["learning"]["arms"])
    if report["training"]:
        names += [a for a in report["training"]["arms"] if a not in names]
    return {name: _colour(i) for i, name in enumerate(names)}


def _bars(labels: list[str], values: list[Any], *, title: str, ylabel: str,
          fmt: str = "{:.2f}", colours: list[str] | None = None) -> dict[str, Any]:
    return {"kind": "bars", "title": title, "ylabel": ylabel, "labels": labels,
            "values": values,
            "texts": ["n/a" if v is None else fmt.format(v) for v in values],
            "colours": colours or [_colour(i) for i in range(len(labels))]}


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _byte_unit(largest: float) -> tuple[str, float]:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if largest >= scale:
            return unit, scale
    return "bytes", 1.0


def comparison_data(report: dict[str, Any]) -> dict[str, Any]:
    """The headline panels side by side: accuracy, update time, throughput."""
    arms = report["learning"]["arms"]
    colours = arm_colours(report)
    panels = [_bars(list(arms), [a["accuracy"] for a in arms.values()],
                    title="Final-test accuracy", ylabel="accuracy",
                    colours=[colours[n] for n in arms])]
    if report["training"]:
        t = report["training"]["arms"]
        panels.append(_bars(list(t), [a["update_seconds"] for a in t.values()],
                            title="Sum of update times", ylabel="seconds", fmt="{:.3g}",
                            colours=[colours[n] for n in t]))
    if report["serving"]:
        s = report["serving"]["phases"]
        panels.append(_bars(list(s), [p["requests_per_second"] for p in s.values()],
                            title="Serving throughput", ylabel="requests per second"))
    return {"size": [11.0, 3.8], "rows": 1, "cols": len(panels), "panels": panels}


def accuracy_data(report: dict[str, Any]) -> dict[str, Any]:
    """Accuracy of every arm, overall and by task family."""
    arms = report["learning"]["arms"]
    colours = arm_colours(report)
    families = list(next(iter(arms.values()))["by_family"])
    series = [{"label": f"{arm} ({a['correct']}/{a['documents']})", "colour": colours[arm],
               "values": [a["accuracy"]] + [f["correct"] / f["documents"]
                                            for f in a["by_family"].values()]}
              for arm, a in arms.items()]
    panel = {"kind": "grouped", "title": "Final-test accuracy by arm and task family",
             "ylabel": "accuracy (exact, strict checker)", "groups": ["all", *families],
             "ylim": [0, 1.05], "series": series}
    return {"size": [8.0, 4.2], "rows": 1, "cols": 1, "panels": [panel]}


def _rank_lines(arms: dict[str, Any], colours: dict[str, str], key: str) -> list[dict[str, Any]]:
    return [{"label": arm if rank["rank"] == 0 else f"{arm} rank {rank['rank']}",
             "colour": colours[arm], "style": RANK_STYLES[rank["rank"] % len(RANK_STYLES)],
             "x": list(range(1, len(rank[key]) + 1)), "y": rank[key]}
            for arm, a in arms.items() for rank in a["ranks"]]


def training_data(report: dict[str, Any]) -> dict[str, Any]:
    """Update time, bytes communicated and tokens per second by arm; every rank's loss,
    learning rate and gradient norm by update."""
    arms = report["training"]["arms"]
    names = list(arms)
    colours = arm_colours(report)
    mine = [colours[n] for n in names]
    per_update = [a["bytes_per_update"] for a in arms.values()]
    unit, scale = _byte_unit(max(per_update))
    panels = [
        _bars(names, [a["median_update_seconds"] for a in arms.values()],
              title="Median update", ylabel="seconds", fmt="{:.3g}", colours=mine),
        _bars(names, [b / scale for b in per_update], title="Gradient bytes per update",
              ylabel=f"{unit} (rank 0)", fmt="{:.3g}", colours=mine),
        _bars(names, [a["tokens_per_second"] for a in arms.values()],
              title="Tokens per update second", ylabel="tokens / s (rank 0)", fmt="{:.3g}",
              colours=mine),
    ]
    for key, title, ylabel in (("loss_by_step", "Training objective", "weighted loss"),
                               ("lr_by_step", "Learning rate", "lr"),
                               ("grad_norm_by_step", "Gradient norm", "norm")):
        panels.append({"kind": "lines", "title": title, "xlabel": "update", "ylabel": ylabel,
                       "series": _rank_lines(arms, colours, key)})
    return {"size": [12.0, 7.0], "rows": 2, "cols": 3, "panels": panels}


def serving_data(report: dict[str, Any]) -> dict[str, Any]:
    """Throughput and latency by serving phase."""
    phases = report["serving"]["phases"]
    names = list(phases)
    latency = {"kind": "grouped", "title": "Latency", "ylabel": "seconds", "groups": names,
               "ylim": None,
               "series": [{"label": key.split("_")[0], "colour": _colour(j + 1),
                           "values": [phases[n][key] for n in names]}
                          for j, key in enumerate(("median_latency_seconds",
                                                   "p95_latency_seconds"))]}
    throughput = _bars(names, [p["requests_per_second"] for p in phases.values()],
                       title="Throughput (pair/single "
                             f"{_num(report['serving']['throughput_ratio'])}x)",
                       ylabel="requests per second")
    return {"size": [9.0, 3.8], "rows": 1, "cols": 2, "panels": [throughput, latency]}


def figure_data(report: dict[str, Any]) -> dict[str, Any]:
    """report.json's ``figures``: every figure the report has data for, by file stem."""
    out = {"comparison": comparison_data(report), "accuracy": accuracy_data(report)}
    if report["training"]:
        out["training"] = training_data(report)
    if report["serving"]:
        out["serving"] = serving_data(report)
    return out


def embedded(name: str, data: dict[str, Any]) -> str:
    """The text each file of figure ``name`` carries: canonical JSON, ASCII only."""
    return json.dumps({"format": FIGURE_FORMAT, "figure": name, "data": data}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def metadata(fmt: str, name: str, data: dict[str, Any]) -> dict[str, Any]:
    text = embedded(name, data)
    if fmt == "svg":
        return {"Date": None, "Title": name, "Description": text}
    if fmt == "pdf":
        return {"CreationDate": None, "ModDate": None, "Title": name, "Subject": text}
    return {"Software": None, PNG_KEY: text}


def _draw_bars(ax: Any, p: dict[str, Any]) -> None:
    heights = [v or 0.0 for v in p["values"]]
    bars = ax.bar(range(len(p["labels"])), heights, color=p["colours"])
    ax.bar_label(bars, labels=p["texts"], fontsize=8, padding=2)
    ax.set_xticks(range(len(p["labels"])), p["labels"], rotation=20, ha="right")
    ax.margins(y=0.15)


def _draw_grouped(ax: Any, p: dict[str, Any]) -> None:
    n = len(p["series"])
    width = 0.8 / n
    for i, s in enumerate(p["series"]):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(p["groups"]))]
        ax.bar(xs, [v or 0.0 for v in s["values"]], width, label=s["label"], color=s["colour"])
    ax.set_xticks(range(len(p["groups"])), p["groups"])
    if p["ylim"] is not None:
        ax.set_ylim(*p["ylim"])
    ax.legend(fontsize=8, frameon=False)


def _draw_lines(ax: Any, p: dict[str, Any]) -> None:
    for s in p["series"]:
        ax.plot(s["x"], s["y"], label=s["label"], color=s["colour"], linestyle=s["style"],
                linewidth=1)
    ax.set_xlabel(p["xlabel"])
    ax.legend(fontsize=8, frameon=False)


DRAW = {"bars": _draw_bars, "grouped": _draw_grouped, "lines": _draw_lines}


def draw(fig: Any, data: dict[str, Any]) -> None:
    """Draw one figure from its data alone."""
    axes = fig.subplots(data["rows"], data["cols"], squeeze=False)
    for index, p in enumerate(data["panels"]):
        ax = axes[index // data["cols"]][index % data["cols"]]
        DRAW[p["kind"]](ax, p)
        ax.set_title(p["title"])
        ax.set_ylabel(p["ylabel"])


def write_figures(figures: dict[str, Any], out_dir: Path) -> list[str]:
    """Write every figure of report.json's ``figures`` in every format; the file names."""
    import matplotlib
    from matplotlib.figure import Figure

    written = []
    with matplotlib.rc_context(RC):
        for name, data in figures.items():
            fig = Figure(figsize=tuple(data["size"]), layout="constrained")
            draw(fig, data)
            for fmt in FORMATS:
                fig.savefig(out_dir / f"{name}.{fmt}", format=fmt, dpi=DPI,
                            metadata=metadata(fmt, name, data))
                written.append(f"{name}.{fmt}")
    return written
