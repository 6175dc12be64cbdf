"""index.html rechecked: the verifiers render the summary page report@2 must have written
and compare it with the published one, section by section and then byte for byte.

The page is a function of report.json and nothing else (its ``action`` member is the
report's action ID). The verifiers render it from their own recomputation of report.json
(``reportchecks.settle``: report.json's own value at each leaf equal to the recomputed one
under the comparison rules, so a float that agrees within ``float_recomputation`` is printed
as the report printed it) and the receipt's action ID. So a page that shows anything but the
recomputed numbers fails here, whatever report.json says, and an edit of report.json alone
fails only report.json's own checks.

Parts, each a check ``index.<part>``: ``head`` (everything outside the sections: title,
action corner, intro) and one per section in ``SECTIONS`` (``learning``, ``comparisons``,
``retention``, ``training``, ``serving``, ``parameters``, ``resources``, ``figures``,
``identity``, ``files``), then ``exact``: the whole page, byte for byte, so an element outside any part
(an injected script) still fails.

The definition is the report recipe's (``nscas.recipes.report.index``); this is an
independent rendering of it, mirrored deliberately (verifiers import nothing of the recipe)
and kept in step with it by the tests.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape
from html.parser import HTMLParser
from typing import Any

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5rem auto;max-width:70rem;padding:0 1rem;
color:#111}
h1{font-size:1.4rem;margin-right:16rem}h2{font-size:1.1rem;margin:1.6rem 0 .4rem}
code{font:12px/1.4 ui-monospace,monospace;word-break:break-all}
#action{position:absolute;top:.5rem;right:1rem;max-width:15rem;font-size:11px;color:#6b7280;
text-align:right}
table{border-collapse:collapse;margin:.4rem 0}
td,th{border-top:1px solid #e5e7eb;padding:.25rem .6rem;vertical-align:top}
th{text-align:left;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
thead th{border-top:none;border-bottom:1px solid #9ca3af}
figure{margin:1rem 0}figure img{max-width:100%;height:auto;border:1px solid #e5e7eb}
figcaption{color:#374151;font-size:13px}
p.note{color:#4b5563;font-size:13px}
"""

Report = dict[str, Any]
Section = Callable[[Report], str | None]


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _count(value: Any) -> str:
    return "n/a" if value is None else f"{value:,}"


def _fixed(value: Any, digits: int) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,.{digits}f}"


def _sig(value: Any) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _percent(value: Any) -> str:
    return "n/a" if value is None else f"{value * 100:.2f}%"


def _yes(value: Any) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def _bytes(value: Any) -> str:
    if value is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:,.2f} {unit}"
    return f"{value:,.0f} bytes"


def _times(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _table(head: list[str], rows: list[list[str]], *, numeric_from: int = 1) -> str:
    """A table of texts: the first ``numeric_from`` columns are headers or text, the rest
    right-aligned numbers."""
    top = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<th>{_e(c)}</th>" if i == 0 else
                         (f'<td class="n">{_e(c)}</td>' if i >= numeric_from
                          else f"<td>{_e(c)}</td>") for i, c in enumerate(row)) + "</tr>"
        for row in rows)
    return f"<table><thead><tr>{top}</tr></thead><tbody>{body}</tbody></table>"


def _section(ident: str, heading: str, body: str) -> str:
    return f'<section id="{ident}"><h2>{_e(heading)}</h2>{body}</section>'


KINDS = {"versus_seed": "versus the seed", "clean_versus_damaged": "clean versus damaged",
         "pair_versus_single": "pair versus single"}


def learning(report: Report) -> str:
    part = report["learning"]
    arms = part["arms"]
    names = list(arms)
    first = arms[names[0]]
    rows = [[f"All tasks, out of {part['documents']}", *(_count(a["correct"])
                                                         for a in arms.values())],
            ["Accuracy", *(_percent(a["accuracy"]) for a in arms.values())]]
    for family, count in first["by_family"].items():
        rows.append([f"{family}, out of {count['documents']}",
                     *(_count(a["by_family"][family]["correct"]) for a in arms.values())])
    held = first["held_out"]
    variants = ", ".join(str(v) for v in held["variants"]) or "none"
    rows.append([f"Held-out variants ({variants}), out of {held['documents']}",
                 *(_count(a["held_out"]["correct"]) for a in arms.values())])
    rows.append([f"Valid JSON objects, out of {part['documents']}",
                 *(_count(a["valid_json_objects"]) for a in arms.values())])
    rows.append(["Retention: mean loss per token",
                 *(_fixed(a["retention_mean_loss"], 6) for a in arms.values())])
    note = ('<p class="note">Correct means the requested JSON schema and exact values, by the '
            "strict checker, rescored from every retained answer. The baseline is "
            f"<code>{_e(part['baseline'])}</code>.</p>")
    return _section("learning", "Final test", _table(["Final test", *names], rows) + note)


def comparisons(report: Report) -> str | None:
    items = report["learning"]["comparisons"]
    if not items:
        return None
    rows = []
    for c in items:
        verdict = c.get("contract")
        rows.append([f"{c['candidate']} {KINDS.get(c['kind'], c['kind'])}", c["baseline"],
                     _count(c["wins"]), _count(c["losses"]), f"{c['gain_points']:+.2f}",
                     _sig(c["p"]),
                     "n/a" if verdict is None else ("passed" if verdict["passed"]
                                                    else "not passed")])
    table = _table(["Comparison", "Baseline", "Wins", "Losses", "Gain (points)",
                    "One-sided exact McNemar p", "Contract"], rows, numeric_from=2)
    note = ('<p class="note">Wins: tasks the candidate answers correctly and the baseline does '
            "not; losses: the reverse. p is the exact one-sided paired McNemar test of the "
            "wins and losses, without correction for the several comparisons.</p>")
    return _section("comparisons", "Paired comparisons", table + note)


def retention(report: Report) -> str:
    rows = []
    for c in report["learning"]["comparisons"]:
        r = c["retention"]
        if r is None:
            continue
        limit = (c.get("contract") or {}).get("retention_upper", {}).get("at_most")
        rows.append([f"{c['candidate']} {KINDS.get(c['kind'], c['kind'])}", _count(r["n"]),
                     f"{r['mean']:+.6f}", _fixed(r["se"], 6),
                     "n/a" if r["upper"] is None else f"{r['upper']:+.6f}",
                     "n/a" if limit is None else f"{limit:+.6f}",
                     _count(r["improved"]), _count(r["worsened"])])
    if not rows:
        return _section("retention", "Retention",
                        '<p class="note">No comparison has retention losses on both sides.'
                        "</p>")
    table = _table(["Comparison", "Probes", "Mean loss change", "Standard error",
                    "Upper bound", "Limit", "Improved", "Worsened"], rows)
    note = ('<p class="note">Change in mean response loss per token on the retention probes '
            "(candidate minus baseline, nats); the upper bound is the contract's approximate "
            "paired bound.</p>")
    return _section("retention", "Retention", table + note)


def training(report: Report) -> str | None:
    part = report["training"]
    if part is None:
        return None
    arms = part["arms"]
    names = list(arms)

    def row(label: str, show: Callable[[dict[str, Any]], str]) -> list[str]:
        return [label, *(show(a) for a in arms.values())]

    rows = [
        row("Ranks (world)", lambda a: _count(a["world"])),
        row("Trained on", lambda a: str(a["documents"])),
        row("Updates", lambda a: _count(a["updates"])),
        row("Sum of update times (s)", lambda a: _fixed(a["update_seconds"], 2)),
        row("Median update (s)", lambda a: _fixed(a["median_update_seconds"], 3)),
        row("Tokens per update second", lambda a: _fixed(a["tokens_per_second"], 1)),
        row("Bytes communicated (rank 0)", lambda a: _bytes(a["bytes_communicated"])),
        row("Bytes per update (rank 0)", lambda a: _bytes(a["bytes_per_update"])),
        row("First loss", lambda a: _fixed(a["first_loss"], 4)),
        row("Last loss", lambda a: _fixed(a["last_loss"], 4)),
        *([row("Mean loss per update", lambda a: _fixed(a.get("mean_loss"), 4))]
          if any("mean_loss" in a for a in arms.values()) else []),
        row("Ranks agree on the parameters", lambda a: _yes(a["parameters_agree"])),
        row("Loop time, self-reported (s)",
            lambda a: _fixed(a["claimed_only"]["loop_seconds"], 2)),
    ]
    body = _table(["Training", *names], rows)
    ratios = [[f"{r['pair']} / {r['single']}", _times(r["update_seconds"]),
               _times(r["median_update_seconds"]),
               _times(r["claimed_only"]["loop_seconds"]),
               _times(r["claimed_only"]["allocated_device_seconds_in_loop"])]
              for r in part["ratios"]]
    if ratios:
        body += _table(["Ratio", "Update time", "Median update", "Loop time (self-reported)",
                        "Device seconds in loop (self-reported)"], ratios)
    note = ('<p class="note">Update times, tokens and bytes are rank 0&#39;s, recomputed from '
            "the hash-chained journals; loop times are the run&#39;s own measurement.</p>")
    return _section("training", "Training cost", body + note)


def serving(report: Report) -> str | None:
    part = report["serving"]
    if part is None:
        return None
    rows = [[phase, f"{_count(p['successes'])}/{_count(p['requests'])}", _count(p["attempts"]),
             _count(p["failed_attempts"]), _fixed(p["wall_seconds"], 2),
             _fixed(p["requests_per_second"], 2), _fixed(p["median_latency_seconds"], 3),
             _fixed(p["p95_latency_seconds"], 3)] for phase, p in part["phases"].items()]
    table = _table(["Phase", "Successful requests", "Attempts", "Failed attempts",
                    "Wall time (s)", "Requests/s", "Median latency (s)", "p95 latency (s)"],
                   rows)
    facts = _table(["Serving", "Value"], [
        ["Throughput ratio (pair / single)", _times(part["throughput_ratio"])],
        ["Retries after the failure", _count(part["failure_retries"])],
        ["Identical outputs across phases", _yes(part["identical_outputs"])],
        ["Cache hits", _count(part["cache_hits"])],
        ["Served arm", "n/a" if part["served_arm"] is None else str(part["served_arm"])],
        ["Replicas", _count(part["replicas"])],
        ["Concurrency", _count(part["concurrency"])],
        ["Device", str(part["device"])],
    ])
    return _section("serving", "Serving", table + facts)


def _g(value: Any) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def parameters(report: Report) -> str | None:
    pairs = (report.get("parameters") or {}).get("pairs") or []
    if not pairs:
        return None
    rows = [[f"{p['candidate']} {KINDS.get(p['kind'], p['kind'])}", p["baseline"],
             _count(p["tensors"]), _count(p["identical_tensors"]), _count(p["elements"]),
             _g(p["relative_l2"]), _g(p["max_abs_diff"])] for p in pairs]
    body = _table(["Pair", "Baseline", "Tensors", "Bit-identical tensors", "Parameters",
                   "Relative L2 difference", "Max absolute difference"], rows, numeric_from=2)
    for p in pairs:
        tensors = [[t["name"], _count(t["elements"]), _yes(t["identical"]),
                    _g(t["relative_l2"]), _g(t["max_abs_diff"])] for t in p["by_tensor"]]
        body += (f"<details><summary>Per tensor: {_e(p['candidate'])} against "
                 f"{_e(p['baseline'])}</summary>"
                 + _table(["Tensor", "Elements", "Bit-identical", "Relative L2 difference",
                           "Max absolute difference"], tensors)
                 + "</details>")
    note = f'<p class="note">{_e(report["parameters"]["note"])}</p>'
    return _section("parameters", "Parameter differences", body + note)


def resources(report: Report) -> str:
    part = report["resources"]
    rows = [[r["input"], r["recipe"], str(r["device_type"]), _count(r["devices_used"]),
             _fixed(r["wall_seconds"], 2), _fixed(r["allocated_device_seconds"], 2)]
            for r in part["runs"]]
    totals = part["totals"]
    rows.append(["Total", "", "", "", _fixed(totals["wall_seconds"], 2), ""])
    table = _table(["Run", "Recipe", "Device", "Devices", "Wall time (s)",
                    "Allocated device seconds"], rows, numeric_from=3)
    cost = part["cost_estimate"]
    estimate = ("no estimate" if cost["estimate"] is None
                else f"{cost['estimate']:,.2f} at {cost['price_per_host_hour']:,.3f} per "
                     "host-hour")
    note = (f'<p class="note">Host-hours {_fixed(cost["host_hours"], 4)}; cost: '
            f"{_e(estimate)} ({_e(cost['note'])}).</p>")
    return _section("resources", "Resources", table + note)


def figures(report: Report) -> str:
    out = []
    for name in report["figures"]:
        links = " &middot; ".join(f'<a href="{_e(name)}.{fmt}">{fmt.upper()}</a>'
                                  for fmt in ("svg", "png", "pdf"))
        out.append(f'<figure><a href="{_e(name)}.svg"><img src="{_e(name)}.svg" '
                   f'alt="{_e(name)} figure"></a><figcaption>{_e(name)}: {links}'
                   "</figcaption></figure>")
    return _section("figures", "Figures", "".join(out))


def identity(report: Report) -> str:
    rows = [[name, f"receipt {oid}"] for name, oid in report["inputs"].items()]
    rows.append(["commitment", str(report["commitment"]["id"])])
    rows.append(["prepared inputs", str(report["prepared"]["prepared"])])
    for arm, a in report["learning"]["arms"].items():
        rows.append([f"model {arm}", str(a["model"])])
    body = "".join(
        f"<tr><th>{_e(name)}</th><td><code>{_e(oid)}</code></td></tr>" for name, oid in rows)
    note = ('<p class="note">The receipt that links this report records action '
            f"<code>{_e(report['action'])}</code>; a receipt&#39;s ID cannot appear in its own "
            "output.</p>")
    return _section("identity", "Inputs and identities",
                    f"<table><tbody>{body}</tbody></table>{note}")


FILES = (("generations.html", "every test prompt with every arm's answer and verdict"),
         ("report.json", "every number on this page, and more"),
         ("resources.json", "where and how long each run ran"))


def files(report: Report) -> str:
    items = [f'<li><a href="{_e(name)}">{_e(name)}</a>: {_e(what)}</li>'
             for name, what in FILES]
    items += [f'<li>{_e(name)}: ' + ", ".join(f'<a href="{_e(name)}.{fmt}">{_e(name)}.{fmt}</a>'
                                              for fmt in ("svg", "png", "pdf")) + "</li>"
              for name in report["figures"]]
    return _section("files", "Files", f"<ul>{''.join(items)}</ul>")


SECTIONS: tuple[tuple[str, Section], ...] = (
    ("learning", learning),
    ("comparisons", comparisons),
    ("retention", retention),
    ("training", training),
    ("serving", serving),
    ("parameters", parameters),
    ("resources", resources),
    ("figures", figures),
    ("identity", identity),
    ("files", files),
)
"""The page's sections in order, by their element IDs; each renders from report.json."""


def render_index(report: Report) -> str:
    """The whole page as text (UTF-8 when written), from report.json's parsed content."""
    title = report["title"]
    body = "".join(html for _, section in SECTIONS if (html := section(report)) is not None)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
        f'<p id="action">action <code>{_e(report["action"])}</code></p>'
        f"<h1>{_e(title)}</h1>"
        f"<p>Recomputed from {len(report['inputs'])} retained input receipts "
        f"({_e(report['format'])}). Every number here is report.json&#39;s, which "
        "<code>nscas verify</code> recomputes from the retained objects. "
        '<a href="generations.html">Every answer</a> &middot; '
        '<a href="report.json">report.json</a></p>'
        f"<main>{body}</main></body></html>\n"
    )


# --- reading a page ------------------------------------------------------------------------

PARTS = ("head", *(ident for ident, _ in SECTIONS))
MAX_DEPTH = 64
VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                  "source", "track", "wbr"})


class _Reader(HTMLParser):
    """Sorts every token of a page by the top-level section it is in (``head`` outside)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.groups: dict[str, list[str]] = {}
        self.stack: list[str] = []
        self.section: str | None = None
        self.depth = 0
        self.problem: str | None = None

    def _add(self, token: str) -> None:
        part = self.section if self.section in PARTS else ("head" if self.section is None
                                                           else "other")
        self.groups.setdefault(part, []).append(token)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "section" and self.section is None:
            self.section = dict(attrs).get("id") or "other"
            self.depth = len(self.stack)
        if tag not in VOID:
            self.stack.append(tag)
            if len(self.stack) > MAX_DEPTH and self.problem is None:
                self.problem = f"elements nest deeper than {MAX_DEPTH}"
        shown = " ".join(f"{k}={v!r}" for k, v in attrs)
        self._add(f"<{tag} {shown}>".replace(" >", ">"))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._add(f"<{tag} {' '.join(f'{k}={v!r}' for k, v in attrs)}/>")

    def handle_endtag(self, tag: str) -> None:
        self._add(f"</{tag}>")
        if tag in self.stack:
            while self.stack and self.stack.pop() != tag:
                pass
        if self.section is not None and len(self.stack) <= self.depth:
            self.section = None

    def handle_data(self, data: str) -> None:
        self._add(data)

    def handle_decl(self, decl: str) -> None:
        self._add(f"<!{decl}>")

    def unknown_decl(self, data: str) -> None:
        self._add(f"<![{data}]>")

    def handle_comment(self, data: str) -> None:
        self._add(f"<!--{data}-->")

    def handle_pi(self, data: str) -> None:
        self._add(f"<?{data}>")


def read_index(text: str) -> tuple[dict[str, list[str]], str | None]:
    """The page's tokens by part, and a problem when it cannot be read as one page."""
    reader = _Reader()
    try:
        reader.feed(text)
        reader.close()
    except Exception as exc:  # hostile markup: a finding, never a crash
        return reader.groups, f"not readable as HTML ({type(exc).__name__}: {exc})"
    return reader.groups, reader.problem


def _short(tokens: list[str], index: int) -> str:
    if index >= len(tokens):
        return "nothing"
    text = tokens[index]
    return repr(text if len(text) <= 80 else text[:77] + "...")


def compare_index(page: str, expected: str) -> tuple[dict[str, list[str]], bool]:
    """Problems by part (``PARTS``, plus ``exact``), and whether the bytes are equal."""
    problems: dict[str, list[str]] = {part: [] for part in (*PARTS, "exact")}
    if page == expected:
        return problems, True
    mine, _ = read_index(expected)
    theirs, unreadable = read_index(page)
    if unreadable is not None:
        problems["exact"].append(unreadable)
    for key in sorted(set(mine) | set(theirs)):
        a, b = theirs.get(key, []), mine.get(key, [])
        if a == b:
            continue
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                     min(len(a), len(b)))
        part = key if key in PARTS else "exact"
        problems[part].append(f"{key if key in PARTS else 'outside the known sections'} "
                              f"shows {_short(a, first)} where {_short(b, first)} was rendered")
    if not problems["exact"]:
        shown = [part for part in PARTS if problems[part]]
        problems["exact"].append("the page's bytes differ from the rendered page's"
                                 + (f" (in {', '.join(shown)})" if shown else ""))
    return problems, False
