"""Line charts drawn on the server as inline SVG: the loss and learning-rate curves of a run's
journals. Only numbers and escaped labels go into the markup; no script, no inline style."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

MAX_POINTS = 600  # per series: a longer journal is thinned evenly, its last point kept
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
W, H = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 22, 34


@dataclass(frozen=True, slots=True, kw_only=True)
class Series:
    label: str
    points: tuple[tuple[float, float], ...]


def line_chart(title: str, series: Sequence[Series], *, x_label: str = "step") -> Markup:
    """An SVG chart of ``series`` (finite points only); empty series draw an empty frame."""
    drawn = [Series(label=s.label, points=_thin(tuple(
        (x, y) for x, y in s.points if math.isfinite(x) and math.isfinite(y))))
        for s in series]
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    x0, x1 = _range(xs)
    y0, y1 = _range(ys)

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT)

    def py(y: float) -> float:
        return H - BOTTOM - (y - y0) / (y1 - y0) * (H - TOP - BOTTOM)

    parts = [f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
             f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
             f'<text x="{LEFT}" y="14" class="chart-title">{escape(title)}</text>',
             f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
             'fill="none" stroke="#bbb"/>']
    for value in (y0, (y0 + y1) / 2, y1):
        parts.append(f'<text x="{LEFT - 4}" y="{py(value) + 4:.1f}" text-anchor="end" '
                     f'class="tick">{_num(value)}</text>')
    for value in (x0, (x0 + x1) / 2, x1):
        parts.append(f'<text x="{px(value):.1f}" y="{H - BOTTOM + 14}" text-anchor="middle" '
                     f'class="tick">{_num(value)}</text>')
    parts.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 4}" text-anchor="middle" '
                 f'class="tick">{escape(x_label)}</text>')
    for i, s in enumerate(drawn):
        colour = COLOURS[i % len(COLOURS)]
        if len(s.points) == 1:
            (x, y), = s.points
            parts.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        elif s.points:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in s.points)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" '
                         f'points="{path}"/>')
        parts.append(f'<text x="{W - RIGHT - 4}" y="{TOP + 14 + 14 * i}" text-anchor="end" '
                     f'fill="{colour}" class="legend">{escape(s.label)}</text>')
    if not xs:
        parts.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" class="tick">'
                     "no points</text>")
    parts.append("</svg>")
    return Markup("".join(parts))


def _thin(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    if len(points) <= MAX_POINTS:
        return points
    step = len(points) / (MAX_POINTS - 1)
    picked = [points[int(i * step)] for i in range(MAX_POINTS - 1)]
    return (*picked, points[-1])


def _range(values: list[float]) -> tuple[float, float]:
    """Axis ends; one value (or none) gets a unit-wide axis around it, never a zero width."""
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    return lo, hi


def _num(value: float) -> str:
    return f"{value:.3g}"
