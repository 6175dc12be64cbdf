"""The report's figures: first their data (report.json's ``figures`` part), then each drawn
from that data alone as SVG, PNG and PDF, with the same data embedded in the file.

``figure_data`` says exactly what each figure draws: per panel its kind (``bars``,
``grouped`` or ``lines``), its title and axis labels, its y range and a note when every value
is zero (a fixed 0..1 axis with the note written on it, never a degenerate 0..0 axis), and
every series with its values, the texts written on the bars and the colours; per figure the
text drawn small in its bottom right corner (``action blake3:...``, the report's action ID:
an output cannot hold the ID of the receipt that links it, but the action exists before the
run). Every arm has one colour in every figure (``ARM_COLOURS``, then ``COLOURS`` in order
for other arm names); serving phases have colours of their own (``PHASE_COLOURS``), never an
arm's. ``draw`` reads nothing else, so the data is the figure; a verifier recomputes the data from the retained evidence and compares it with
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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

    from .learning import Learning
    from .parameters import Parameters
    from .serving import Serving
    from .training import TrainArm, Training

FIGURE_FORMAT = "nscas-figure/2"
"""Version 2: ``corner`` per figure, ``ylim`` and ``note`` per panel, a fixed arm colour map."""
FORMATS = ("svg", "png", "pdf")
PNG_KEY = "nscas-figure"
RC: dict[RcKeyType, object] = {"svg.hashsalt": "nscas-report", "svg.fonttype": "path", "font.size": 9,
      "axes.spines.top": False, "axes.spines.right": False}
ARM_COLOURS = {"seed": "#6b7280", "clean-single": "#2563eb", "damaged-single": "#dc2626",
               "clean-pair": "#059669"}
"""The experiment's arms, each in its own colour in every figure of every report."""
COLOURS = ("#d97706", "#7c3aed", "#db2777", "#65a30d", "#92400e", "#4f46e5")
"""Other arm names, in report order, take these in turn."""
PHASE_COLOURS = ("#0e7490", "#67c5d9")
"""Serving phases (bars) and latency quantiles (median, p95): no arm's colour."""
ZERO_NOTE = "every value is 0"
CORNER = {"x": 0.995, "y": 0.005, "fontsize": 6, "color": "#9ca3af"}
NOTE = {"fontsize": 8, "color": "#6b7280"}
RANK_STYLES = ("-", "--", ":", "-.")
KIND_STYLES = {"versus_seed": "-", "clean_versus_damaged": "--", "pair_versus_single": ":"}
"""The parameters figure: a pair's line is its candidate's colour in its comparison's style."""
DPI = 120


@dataclass(frozen=True, slots=True, kw_only=True)
class Bars:
    """A bar per label, its text written on it."""

    title: str
    ylabel: str
    labels: tuple[str, ...]
    values: tuple[float | None, ...]
    """None: no value (drawn as 0, written ``n/a``)."""
    texts: tuple[str, ...]
    colours: tuple[str, ...]
    ylim: tuple[float, float] | None
    note: str | None

    def to_json(self) -> dict[str, Any]:
        return {"kind": "bars", "title": self.title, "ylabel": self.ylabel,
                "labels": list(self.labels), "values": list(self.values),
                "texts": list(self.texts), "colours": list(self.colours),
                "ylim": _limits(self.ylim), "note": self.note}


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSeries:
    label: str
    colour: str
    values: tuple[float | None, ...]
    """One per group."""

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "colour": self.colour, "values": list(self.values)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Grouped:
    """Bars side by side within each group, a series per colour."""

    title: str
    ylabel: str
    groups: tuple[str, ...]
    ylim: tuple[float, float] | None
    series: tuple[GroupSeries, ...]
    note: str | None

    def to_json(self) -> dict[str, Any]:
        return {"kind": "grouped", "title": self.title, "ylabel": self.ylabel,
                "groups": list(self.groups), "ylim": _limits(self.ylim),
                "series": [x.to_json() for x in self.series], "note": self.note}


@dataclass(frozen=True, slots=True, kw_only=True)
class LineSeries:
    label: str
    colour: str
    style: str
    """A matplotlib line style."""
    x: tuple[int, ...]
    y: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "colour": self.colour, "style": self.style,
                "x": list(self.x), "y": list(self.y)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Lines:
    title: str
    xlabel: str
    ylabel: str
    series: tuple[LineSeries, ...]
    ylim: tuple[float, float] | None
    note: str | None

    def to_json(self) -> dict[str, Any]:
        return {"kind": "lines", "title": self.title, "xlabel": self.xlabel,
                "ylabel": self.ylabel, "series": [x.to_json() for x in self.series],
                "ylim": _limits(self.ylim), "note": self.note}


Panel = Bars | Grouped | Lines


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureData:
    """One figure: its size in inches, its panels on a rows x cols grid, row by row, and the
    text in its bottom right corner."""

    size: tuple[float, float]
    rows: int
    cols: int
    panels: tuple[Panel, ...]
    corner: str

    def to_json(self) -> dict[str, Any]:
        return {"size": list(self.size), "rows": self.rows, "cols": self.cols,
                "panels": [p.to_json() for p in self.panels], "corner": self.corner}


def _limits(ylim: tuple[float, float] | None) -> list[float] | None:
    return list(ylim) if ylim is not None else None


def _all_zero(values: Any) -> bool:
    """Every value is 0 or none (an empty panel counts): no range to draw."""
    return all(not v for v in values)


def _zero_axis(values: Any, ylim: tuple[float, float] | None
               ) -> tuple[tuple[float, float] | None, str | None]:
    """(ylim, note): a fixed 0..1 axis and the note when every value is zero."""
    if not _all_zero(values):
        return ylim, None
    return (ylim if ylim is not None else (0.0, 1.0)), ZERO_NOTE


def arm_colours(learning: Learning, training: Training | None) -> dict[str, str]:
    """One colour per arm, the same in every figure: ``ARM_COLOURS`` for the experiment's
    arms, ``COLOURS`` in turn for the others (the learning table's order first)."""
    names = list(learning.arms)
    if training is not None:
        names += [a for a in training.arms if a not in names]
    others = [n for n in names if n not in ARM_COLOURS]
    return {name: ARM_COLOURS.get(name) or COLOURS[others.index(name) % len(COLOURS)]
            for name in names}


def _bars(labels: list[str], values: list[Any], *, title: str, ylabel: str,
          colours: list[str], fmt: str = "{:.2f}") -> Bars:
    ylim, note = _zero_axis(values, None)
    return Bars(title=title, ylabel=ylabel, labels=tuple(labels), values=tuple(values),
                texts=tuple("n/a" if v is None else fmt.format(v) for v in values),
                colours=tuple(colours), ylim=ylim, note=note)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _byte_unit(largest: float) -> tuple[str, float]:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if largest >= scale:
            return unit, scale
    return "bytes", 1.0


def _phase_colours(n: int) -> list[str]:
    return [PHASE_COLOURS[0]] * n


def comparison_data(learning: Learning, training: Training | None,
                    serving: Serving | None, corner: str) -> FigureData:
    """The headline panels side by side: accuracy, update time, throughput."""
    arms = learning.arms
    colours = arm_colours(learning, training)
    panels: list[Panel] = [_bars(list(arms), [a.accuracy for a in arms.values()],
                                 title="Final-test accuracy", ylabel="accuracy",
                                 colours=[colours[n] for n in arms])]
    if training is not None:
        t = training.arms
        panels.append(_bars(list(t), [a.head.update_seconds for a in t.values()],
                            title="Sum of update times", ylabel="seconds", fmt="{:.3g}",
                            colours=[colours[n] for n in t]))
    if serving is not None:
        s = serving.phases
        panels.append(_bars(list(s), [p.requests_per_second for p in s.values()],
                            title="Serving throughput", ylabel="requests per second",
                            colours=_phase_colours(len(s))))
    return FigureData(size=(11.0, 3.8), rows=1, cols=len(panels), panels=tuple(panels),
                      corner=corner)


def _grouped(*, title: str, ylabel: str, groups: tuple[str, ...],
             ylim: tuple[float, float] | None, series: tuple[GroupSeries, ...]) -> Grouped:
    ylim, note = _zero_axis([v for s in series for v in s.values], ylim)
    return Grouped(title=title, ylabel=ylabel, groups=groups, ylim=ylim, series=series,
                   note=note)


def accuracy_data(learning: Learning, training: Training | None, corner: str) -> FigureData:
    """Accuracy of every arm, overall and by task family."""
    arms = learning.arms
    colours = arm_colours(learning, training)
    families = list(next(iter(arms.values())).by_family)
    series = tuple(GroupSeries(label=f"{arm} ({a.correct}/{a.documents})", colour=colours[arm],
                               values=(a.accuracy, *(f.correct / f.documents
                                                     for f in a.by_family.values())))
                   for arm, a in arms.items())
    panel = _grouped(title="Final-test accuracy by arm and task family",
                     ylabel="accuracy (exact, strict checker)", groups=("all", *families),
                     ylim=(0, 1.05), series=series)
    return FigureData(size=(8.0, 4.2), rows=1, cols=1, panels=(panel,), corner=corner)


def _rank_lines(arms: Mapping[str, TrainArm], colours: dict[str, str],
                key: str) -> tuple[LineSeries, ...]:
    return tuple(
        LineSeries(label=arm if rank.rank == 0 else f"{arm} rank {rank.rank}",
                   colour=colours[arm], style=RANK_STYLES[rank.rank % len(RANK_STYLES)],
                   x=tuple(range(1, len(getattr(rank, key)) + 1)), y=getattr(rank, key))
        for arm, a in arms.items() for rank in a.ranks)


def training_data(learning: Learning, training: Training, corner: str) -> FigureData:
    """Update time, bytes communicated and tokens per second by arm; every rank's loss,
    learning rate and gradient norm by update."""
    arms = training.arms
    names = list(arms)
    colours = arm_colours(learning, training)
    mine = [colours[n] for n in names]
    per_update = [a.bytes_per_update for a in arms.values()]
    unit, scale = _byte_unit(max(per_update))
    panels: list[Panel] = [
        _bars(names, [a.head.median_update_seconds for a in arms.values()],
              title="Median update", ylabel="seconds", fmt="{:.3g}", colours=mine),
        _bars(names, [b / scale for b in per_update], title="Gradient bytes per update",
              ylabel=f"{unit} (rank 0)", fmt="{:.3g}", colours=mine),
        _bars(names, [a.head.tokens_per_second for a in arms.values()],
              title="Tokens per update second", ylabel="tokens / s (rank 0)", fmt="{:.3g}",
              colours=mine),
    ]
    for key, title, ylabel in (("loss_by_step", "Training objective", "weighted loss"),
                               ("lr_by_step", "Learning rate", "lr"),
                               ("grad_norm_by_step", "Gradient norm", "norm")):
        series = _rank_lines(arms, colours, key)
        ylim, note = _zero_axis([y for s in series for y in s.y], None)
        panels.append(Lines(title=title, xlabel="update", ylabel=ylabel, series=series,
                            ylim=ylim, note=note))
    return FigureData(size=(12.0, 7.0), rows=2, cols=3, panels=tuple(panels), corner=corner)


def serving_data(serving: Serving, corner: str) -> FigureData:
    """Throughput and latency by serving phase."""
    phases = serving.phases
    names = list(phases)
    latency = _grouped(
        title="Latency", ylabel="seconds", groups=tuple(names), ylim=None,
        series=tuple(GroupSeries(label=key.split("_")[0], colour=PHASE_COLOURS[j],
                                 values=tuple(phases[n].metrics[key] for n in names))
                     for j, key in enumerate(("median_latency_seconds",
                                              "p95_latency_seconds"))))
    throughput = _bars(names, [p.requests_per_second for p in phases.values()],
                       title=f"Throughput (pair/single {_num(serving.throughput_ratio)}x)",
                       ylabel="requests per second", colours=_phase_colours(len(names)))
    return FigureData(size=(9.0, 3.8), rows=1, cols=2, panels=(throughput, latency),
                      corner=corner)


def parameters_data(learning: Learning, training: Training | None, parameters: Parameters,
                    corner: str) -> FigureData:
    """The relative L2 difference of every compared pair: over all parameters (a bar per
    pair) and per layer (a line per pair, its candidate's colour, its comparison's style;
    a layer whose distance is undefined is left out)."""
    colours = arm_colours(learning, training)
    pairs = [p.to_json() for p in parameters.pairs]
    labels = [f"{p['candidate']} vs {p['baseline']}" for p in pairs]
    overall = _bars(labels, [p["relative_l2"] for p in pairs],
                    title="Relative L2 difference, all parameters",
                    ylabel="relative L2 difference", fmt="{:.3g}",
                    colours=[colours[p["candidate"]] for p in pairs])
    series = tuple(
        LineSeries(label=text, colour=colours[p["candidate"]],
                   style=KIND_STYLES.get(p["kind"], "-."),
                   x=tuple(x["layer"] for x in p["layers"] if x["relative_l2"] is not None),
                   y=tuple(x["relative_l2"] for x in p["layers"]
                           if x["relative_l2"] is not None))
        for text, p in zip(labels, pairs, strict=True))
    ylim, note = _zero_axis([y for s in series for y in s.y], None)
    by_layer = Lines(title="Relative L2 difference by layer", xlabel="layer",
                     ylabel="relative L2 difference", series=series, ylim=ylim, note=note)
    return FigureData(size=(11.0, 4.2), rows=1, cols=2, panels=(overall, by_layer),
                      corner=corner)


def figure_data(learning: Learning, training: Training | None,
                serving: Serving | None, parameters: Parameters,
                action: str) -> dict[str, FigureData]:
    """report.json's ``figures``: every figure the report has data for, by file stem, each
    with ``action <action ID>`` in its corner."""
    corner = f"action {action}"
    out = {"comparison": comparison_data(learning, training, serving, corner),
           "accuracy": accuracy_data(learning, training, corner)}
    if training is not None:
        out["training"] = training_data(learning, training, corner)
    if serving is not None:
        out["serving"] = serving_data(serving, corner)
    if parameters.pairs:
        out["parameters"] = parameters_data(learning, training, parameters, corner)
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


def _finish(ax: Any, ylim: tuple[float, float] | None, note: str | None) -> None:
    if ylim is not None:
        ax.set_ylim(*ylim)
    if note is not None:
        ax.text(0.5, 0.5, note, transform=ax.transAxes, ha="center", va="center", **NOTE)


def _draw_bars(ax: Any, p: Bars) -> None:
    heights = [v or 0.0 for v in p.values]
    bars = ax.bar(range(len(p.labels)), heights, color=list(p.colours))
    ax.bar_label(bars, labels=list(p.texts), fontsize=8, padding=2)
    ax.set_xticks(range(len(p.labels)), list(p.labels), rotation=20, ha="right")
    ax.margins(y=0.15)
    _finish(ax, p.ylim, p.note)


def _draw_grouped(ax: Any, p: Grouped) -> None:
    n = len(p.series)
    width = 0.8 / n
    for i, s in enumerate(p.series):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(p.groups))]
        ax.bar(xs, [v or 0.0 for v in s.values], width, label=s.label, color=s.colour)
    ax.set_xticks(range(len(p.groups)), list(p.groups))
    _finish(ax, p.ylim, p.note)
    ax.legend(fontsize=8, frameon=False)


def _draw_lines(ax: Any, p: Lines) -> None:
    for s in p.series:
        ax.plot(list(s.x), list(s.y), label=s.label, color=s.colour, linestyle=s.style,
                linewidth=1)
    ax.set_xlabel(p.xlabel)
    _finish(ax, p.ylim, p.note)
    if p.series:
        ax.legend(fontsize=8, frameon=False)


LAYOUT_RECT = (0.0, 0.03, 1.0, 0.97)
"""Where the panels are laid out: clear of the corner text."""


def draw(fig: Any, data: FigureData) -> None:
    """Draw one figure from its data alone, its corner text kept clear of the panels."""
    axes = fig.subplots(data.rows, data.cols, squeeze=False)
    for index, p in enumerate(data.panels):
        ax = axes[index // data.cols][index % data.cols]
        if isinstance(p, Bars):
            _draw_bars(ax, p)
        elif isinstance(p, Grouped):
            _draw_grouped(ax, p)
        else:
            _draw_lines(ax, p)
        ax.set_title(p.title)
        ax.set_ylabel(p.ylabel)
    corner = dict(CORNER)
    fig.text(corner.pop("x"), corner.pop("y"), data.corner, ha="right", va="bottom", **corner)


def write_figures(figures: Mapping[str, FigureData], out_dir: Path) -> None:
    """Write every figure of report.json's ``figures`` in every format."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    with matplotlib.rc_context(RC):
        for name, data in figures.items():
            # Laid out once, then saved in each format as laid out: a figure that kept its
            # layout engine would be laid out again, in a whole extra draw, by every savefig
            # (two thirds of the report's figure time).
            fig = Figure(figsize=data.size)
            draw(fig, data)
            ConstrainedLayoutEngine(rect=LAYOUT_RECT).execute(fig)
            for fmt in FORMATS:
                fig.savefig(out_dir / f"{name}.{fmt}", format=fmt, dpi=DPI,
                            metadata=metadata(fmt, name, data.to_json()))
