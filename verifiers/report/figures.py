"""The report's figures rechecked: what each figure draws, recomputed, and read back from the
figure files themselves.

The report recipe draws every figure from report.json's ``figures`` part alone and embeds
the same data in each file: the canonical JSON (sorted keys, no spaces, ASCII) of
``{"format": "nscas-figure/<1 or 2>", "figure": <name>, "data": <the figure's data>}`` in the SVG's
Dublin Core ``<dc:description>``, in the PNG's ``tEXt`` (or ``iTXt``) chunk ``nscas-figure``
and in the PDF's document-information ``/Subject`` string. ``figure_data`` recomputes that
data from the verifiers' own recomputed report parts; ``embedded`` reads it from a file with
the standard library only (PNG chunks with their CRCs, a PDF literal string, SVG text).

What cannot be rechecked this way: that the pixels or paths of a file are the drawing of
its data (that needs the recipe's own plotting library and fonts); the data a file carries,
its format and its name are checked.

Definitions (as the report recipe draws them): bar texts are the values formatted
(``{:.2f}``, or ``{:.3g}`` for seconds, bytes and tokens per second), ``n/a`` for none; the
training figure draws every rank's loss, learning rate and gradient norm by effective step.
Version 1 (``report@1``, ``nscas-figure/1``): arm colours follow the learning table's order,
then any other trained arm, from one palette that the serving phases share. Version 2
(``report@2``, ``nscas-figure/2``): the experiment's arms have fixed colours
(``ARM_COLOURS``), other arm names take ``OTHER_COLOURS`` in report order, serving phases
and latency quantiles take ``PHASE_COLOURS``; every panel has a ``ylim`` and a ``note``: when
every value is zero or none, a 0..1 axis (unless the panel fixes one) and the note
``every value is 0``, else none; every figure has ``corner``: ``action <the action ID>``; the ``parameters`` figure (when
the report compares any pair) draws each pair's relative L2 difference over all parameters
(bars, ``{:.3g}``) and per layer (lines, the layers whose distance is defined), in the
candidate arm's colour and the comparison kind's line style (``KIND_STYLES``).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

from ..core.errors import RecordParseError
from ..records.reading import parse_json

FIGURE_FORMATS = {1: "nscas-figure/1", 2: "nscas-figure/2"}
"""The embedded data's format by report recipe version."""
FORMATS = ("svg", "png", "pdf")
PNG_KEY = b"nscas-figure"
COLOURS = ("#6b7280", "#2563eb", "#dc2626", "#059669", "#d97706", "#7c3aed", "#0891b2")
"""Version 1: arms and serving phases alike, by position."""
ARM_COLOURS = {"seed": "#6b7280", "clean-single": "#2563eb", "damaged-single": "#dc2626",
               "clean-pair": "#059669"}
OTHER_COLOURS = ("#d97706", "#7c3aed", "#db2777", "#65a30d", "#92400e", "#4f46e5")
PHASE_COLOURS = ("#0e7490", "#67c5d9")
ZERO_NOTE = "every value is 0"
RANK_STYLES = ("-", "--", ":", "-.")
SIZES = {"comparison": [11.0, 3.8], "accuracy": [8.0, 4.2], "training": [12.0, 7.0],
         "serving": [9.0, 3.8], "parameters": [11.0, 4.2]}
KIND_STYLES = {"versus_seed": "-", "clean_versus_damaged": "--", "pair_versus_single": ":"}
"""Version 2's parameters figure: a pair's line style by its comparison's kind (else ``-.``)."""
MAX_TEXT = 64 * 1024 * 1024
"""Largest embedded text read (a decompressed iTXt chunk is cut off there)."""


def _colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def _float(value: Any) -> Any:
    return float(value) if isinstance(value, Fraction) else value


@dataclass(frozen=True, slots=True, kw_only=True)
class _Style:
    """What a recipe version draws beyond the data: zero axes, phase colours, the corner."""

    version: int
    corner: str | None

    def zero(self, panel: dict[str, Any], values: list[Any], *, key: str = "ylim") -> None:
        """Version 2: the panel's ``ylim`` and ``note`` members, in place."""
        if self.version < 2:
            return
        if all(not v for v in values):
            panel["ylim"] = panel.get("ylim") or [0.0, 1.0]
            panel["note"] = ZERO_NOTE
        else:
            panel.setdefault("ylim", None)
            panel["note"] = None

    def phases(self, n: int) -> list[str] | None:
        return None if self.version < 2 else [PHASE_COLOURS[0]] * n

    def quantile(self, j: int) -> str:
        return _colour(j + 1) if self.version < 2 else PHASE_COLOURS[j]

    def figure(self, name: str, rows: int, cols: int, panels: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"size": SIZES[name], "rows": rows, "cols": cols,
                               "panels": panels}
        if self.version >= 2:
            out["corner"] = self.corner
        return out


def _bars(style: _Style, labels: list[str], values: list[Any], *, title: str, ylabel: str,
          fmt: str = "{:.2f}", colours: list[str] | None = None) -> dict[str, Any]:
    panel = {"kind": "bars", "title": title, "ylabel": ylabel, "labels": labels,
             "values": values,
             "texts": ["n/a" if v is None else fmt.format(_float(v)) for v in values],
             "colours": colours or [_colour(i) for i in range(len(labels))]}
    style.zero(panel, values)
    return panel


def _byte_unit(largest: float) -> tuple[str, float]:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if largest >= scale:
            return unit, scale
    return "bytes", 1.0


def arm_colours(names: list[str], version: int) -> dict[str, str]:
    """Each arm's colour in every figure of a report of recipe ``version``."""
    if version < 2:
        return {name: _colour(i) for i, name in enumerate(names)}
    others = [n for n in names if n not in ARM_COLOURS]
    return {n: ARM_COLOURS.get(n) or OTHER_COLOURS[others.index(n) % len(OTHER_COLOURS)]
            for n in names}


def figure_data(learning: dict[str, Any], training: dict[str, Any] | None,
                serving: dict[str, Any] | None, *, version: int = 1,
                action: str | None = None,
                parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """report.json's ``figures`` from the recomputed ``learning``, ``training``, ``serving``
    and (version 2) ``parameters`` parts, as report@``version`` draws them (``action``: the
    report's action ID, shown from version 2)."""
    style = _Style(version=version, corner=f"action {action}" if version >= 2 else None)
    arms = learning["arms"]
    names = list(arms) + [a for a in (training or {"arms": {}})["arms"] if a not in arms]
    colours = arm_colours(names, version)
    comparison = [_bars(style, list(arms), [a["accuracy"] for a in arms.values()],
                        title="Final-test accuracy", ylabel="accuracy",
                        colours=[colours[n] for n in arms])]
    if training:
        t = training["arms"]
        comparison.append(_bars(style, list(t), [a["update_seconds"] for a in t.values()],
                                title="Sum of update times", ylabel="seconds", fmt="{:.3g}",
                                colours=[colours[n] for n in t]))
    if serving:
        s = serving["phases"]
        comparison.append(_bars(style, list(s), [p["requests_per_second"] for p in s.values()],
                                title="Serving throughput", ylabel="requests per second",
                                colours=style.phases(len(s))))
    out: dict[str, Any] = {
        "comparison": style.figure("comparison", 1, len(comparison), comparison),
        "accuracy": _accuracy(style, arms, colours),
    }
    if training:
        out["training"] = _training(style, training["arms"], colours)
    if serving:
        out["serving"] = _serving(style, serving)
    if version >= 2 and parameters is not None and parameters["pairs"]:
        out["parameters"] = _parameters(style, parameters["pairs"], colours)
    return out


def _parameters(style: _Style, pairs: list[dict[str, Any]],
                colours: dict[str, str]) -> dict[str, Any]:
    """A bar per pair (relative L2 over all parameters) and a line per pair (per layer, the
    layers with a defined distance), in the candidate's colour."""
    labels = [f"{p['candidate']} vs {p['baseline']}" for p in pairs]
    overall = _bars(style, labels, [p["relative_l2"] for p in pairs],
                    title="Relative L2 difference, all parameters",
                    ylabel="relative L2 difference", fmt="{:.3g}",
                    colours=[colours[p["candidate"]] for p in pairs])
    series = [{"label": label, "colour": colours[p["candidate"]],
               "style": KIND_STYLES.get(p["kind"], "-."),
               "x": [x["layer"] for x in p["layers"] if x["relative_l2"] is not None],
               "y": [x["relative_l2"] for x in p["layers"] if x["relative_l2"] is not None]}
              for label, p in zip(labels, pairs, strict=True)]
    lines = {"kind": "lines", "title": "Relative L2 difference by layer", "xlabel": "layer",
             "ylabel": "relative L2 difference", "series": series}
    style.zero(lines, [y for x in series for y in x["y"]])
    return style.figure("parameters", 1, 2, [overall, lines])


def _accuracy(style: _Style, arms: dict[str, Any], colours: dict[str, str]) -> dict[str, Any]:
    families = list(next(iter(arms.values()))["by_family"])
    series = [{"label": f"{arm} ({a['correct']}/{a['documents']})", "colour": colours[arm],
               "values": [a["accuracy"]] + [Fraction(f["correct"], f["documents"])
                                            for f in a["by_family"].values()]}
              for arm, a in arms.items()]
    panel = {"kind": "grouped", "title": "Final-test accuracy by arm and task family",
             "ylabel": "accuracy (exact, strict checker)", "groups": ["all", *families],
             "ylim": [0, 1.05], "series": series}
    style.zero(panel, [v for x in series for v in x["values"]])
    return style.figure("accuracy", 1, 1, [panel])


def _training(style: _Style, arms: dict[str, Any], colours: dict[str, str]) -> dict[str, Any]:
    names = list(arms)
    mine = [colours[n] for n in names]
    per_update = [_float(a["bytes_per_update"]) for a in arms.values()]
    unit, scale = _byte_unit(max(per_update))
    panels = [
        _bars(style, names, [a["median_update_seconds"] for a in arms.values()],
              title="Median update", ylabel="seconds", fmt="{:.3g}", colours=mine),
        _bars(style, names, [b / scale for b in per_update], title="Gradient bytes per update",
              ylabel=f"{unit} (rank 0)", fmt="{:.3g}", colours=mine),
        _bars(style, names, [a["tokens_per_second"] for a in arms.values()],
              title="Tokens per update second", ylabel="tokens / s (rank 0)", fmt="{:.3g}",
              colours=mine),
    ]
    for key, title, ylabel in (("loss_by_step", "Training objective", "weighted loss"),
                               ("lr_by_step", "Learning rate", "lr"),
                               ("grad_norm_by_step", "Gradient norm", "norm")):
        series = [{"label": arm if r["rank"] == 0 else f"{arm} rank {r['rank']}",
                   "colour": colours[arm], "style": RANK_STYLES[r["rank"] % len(RANK_STYLES)],
                   "x": list(range(1, len(r[key]) + 1)), "y": r[key]}
                  for arm, a in arms.items() for r in a["ranks"]]
        panel = {"kind": "lines", "title": title, "xlabel": "update", "ylabel": ylabel,
                 "series": series}
        style.zero(panel, [y for x in series for y in x["y"]])
        panels.append(panel)
    return style.figure("training", 2, 3, panels)


def _serving(style: _Style, serving: dict[str, Any]) -> dict[str, Any]:
    phases = serving["phases"]
    names = list(phases)
    ratio = serving["throughput_ratio"]
    throughput = _bars(style, names, [p["requests_per_second"] for p in phases.values()],
                       title="Throughput (pair/single "
                             f"{'n/a' if ratio is None else format(float(ratio), '.2f')}x)",
                       ylabel="requests per second", colours=style.phases(len(names)))
    series = [{"label": key.split("_")[0], "colour": style.quantile(j),
               "values": [phases[n][key] for n in names]}
              for j, key in enumerate(("median_latency_seconds", "p95_latency_seconds"))]
    latency = {"kind": "grouped", "title": "Latency", "ylabel": "seconds", "groups": names,
               "ylim": None, "series": series}
    style.zero(latency, [v for x in series for v in x["values"]])
    return style.figure("serving", 1, 2, [throughput, latency])


# --- reading a figure file's own copy of its data --------------------------------------------

class FigureError(ValueError):
    """A figure file that does not carry readable figure data."""


def embedded(fmt: str, data: bytes) -> Any:
    """The parsed JSON a figure file of format ``fmt`` carries; raises ``FigureError``."""
    text = {"svg": _svg_text, "png": _png_text, "pdf": _pdf_text}[fmt](data)
    try:
        return parse_json(text, what=f"the {fmt.upper()} file's figure data")
    except RecordParseError as exc:
        raise FigureError(exc.message) from None


_T = TypeVar("_T")


def _one(found: list[_T], what: str) -> _T:
    if len(found) != 1:
        raise FigureError(f"holds {len(found)} {what}, not exactly one")
    return found[0]


def _svg_text(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FigureError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.startswith("<?xml") or "<svg" not in text:
        raise FigureError("not an SVG document")
    start, end = "<dc:description>", "</dc:description>"
    at = _one([i for i in _find_all(text, start)], f"{start} elements")
    stop = text.find(end, at)
    if stop < 0 or "<metadata>" not in text[:at]:
        raise FigureError(f"its {start} is not closed or not inside <metadata>")
    body = text[at + len(start):stop]
    if "<" in body:
        raise FigureError(f"its {start} holds markup, not text")
    for entity, char in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'")):
        body = body.replace(entity, char)
    return body.replace("&amp;", "&")


def _find_all(text: str, needle: str) -> list[int]:
    out, at = [], text.find(needle)
    while at >= 0:
        out.append(at)
        at = text.find(needle, at + 1)
    return out


def _png_text(data: bytes) -> str:
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise FigureError("not a PNG file")
    at = 8
    found: list[tuple[bytes, bytes]] = []
    while at < len(data):
        if at + 12 > len(data):
            raise FigureError(f"a chunk at byte {at} is cut short")
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if len(body) != length or at + 12 + length > len(data):
            raise FigureError(f"chunk {kind!r} at byte {at} is cut short")
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise FigureError(f"chunk {kind!r} at byte {at} fails its CRC")
        if kind in (b"tEXt", b"iTXt") and body.split(b"\0", 1)[0] == PNG_KEY:
            found.append((kind, body[len(PNG_KEY) + 1:]))
        at += 12 + length
        if kind == b"IEND":
            break
    kind, body = _one(found, f"{PNG_KEY.decode()} text chunks")
    if kind == b"tEXt":
        return body.decode("latin-1")
    if len(body) < 2:
        raise FigureError("its iTXt chunk is cut short")
    compressed, rest = body[0], body[2:]
    parts = rest.split(b"\0", 2)
    if len(parts) != 3:
        raise FigureError("its iTXt chunk is malformed")
    raw = parts[2]
    if compressed:
        inflate = zlib.decompressobj()
        try:
            raw = inflate.decompress(raw, MAX_TEXT)
        except zlib.error as exc:
            raise FigureError(f"its iTXt chunk does not inflate ({exc})") from None
        if inflate.unconsumed_tail:
            raise FigureError(f"its iTXt text is larger than {MAX_TEXT} bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FigureError(f"its iTXt text is not UTF-8 ({exc.reason})") from None


_PDF_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("b"): b"\b",
                ord("f"): b"\f", ord("("): b"(", ord(")"): b")", ord("\\"): b"\\"}


def _pdf_text(data: bytes) -> str:
    if not data.startswith(b"%PDF-"):
        raise FigureError("not a PDF file")
    key = b"/Subject ("
    at = _one([i for i in _find_all_bytes(data, key)], "/Subject strings")
    i, depth, out = at + len(key), 1, bytearray()
    while True:
        if i >= len(data):
            raise FigureError("its /Subject string is not closed")
        c = data[i]
        if c == ord("\\"):
            nxt = data[i + 1] if i + 1 < len(data) else None
            if nxt is None:
                raise FigureError("its /Subject string is not closed")
            if nxt in _PDF_ESCAPES:
                out += _PDF_ESCAPES[nxt]
                i += 2
            elif ord("0") <= nxt <= ord("7"):
                j = i + 1
                while j < min(i + 4, len(data)) and ord("0") <= data[j] <= ord("7"):
                    j += 1
                out.append(int(data[i + 1:j], 8) & 0xFF)
                i = j
            elif nxt in (ord("\r"), ord("\n")):
                i += 2
            else:
                out.append(nxt)
                i += 2
            continue
        if c == ord("("):
            depth += 1
        elif c == ord(")"):
            depth -= 1
            if depth == 0:
                break
        out.append(c)
        i += 1
    try:
        return out.decode("ascii")
    except UnicodeDecodeError:
        raise FigureError("its /Subject string is not ASCII text") from None


def _find_all_bytes(data: bytes, needle: bytes) -> list[int]:
    out, at = [], data.find(needle)
    while at >= 0:
        out.append(at)
        at = data.find(needle, at + 1)
    return out
