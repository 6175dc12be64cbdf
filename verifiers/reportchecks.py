"""``report`` receipts rechecked (EXPERIMENT 6): every headline claim and every number of
report.json recomputed from the retained objects by ``reportcompute``, plus the page and files.

Checks, each named ``report.<8 hex>.<what>``:

- ``inputs``: the input receipts describe one experiment (rules in ``reportinputs``);
- ``files``: the output tree holds report.json, resources.json, generations.html and each
  figure the report has data for as SVG, PNG and PDF (what the figures draw is not rechecked);
- ``json.<part>`` for the parts ``learning`` (with ``contract``), ``training``, ``serving``,
  ``resources`` and ``header`` (format, title, inputs, prepared sets, commitment, audit):
  passed when every recomputed field equals report.json's. Otherwise each differing field is
  its own failed check ``json.<path>`` (``json.learning.arms.seed.correct``,
  ``json.learning.comparisons[0].wins``). Fields report.json holds that are not recomputed
  are listed in one skipped ``json.<part>.not_recomputed``; prose (``note``, ``notes``) is
  not compared;
- ``resources_json``: resources.json holds what report.json's ``resources`` holds;
- ``page.tasks`` and ``page.answers``: generations.html names every test task id and shows
  every arm's retained answer (HTML-escaped);
- ``weights``: the parameter digests report.json names are the ones rebuilt from the
  checkpoints' weight files; skipped, never passed, when the weights are not available.

Each part runs on its own: an unusable object skips that part and its claims, not the rest.
The claims themselves (``documents``, ``correct.<arm>``, ``gain.<arm>``, ...) are compared by
the receipt driver with the values recomputed here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from html import escape
from typing import Any, Protocol

from .closure import Objects
from .compare import differences
from .errors import InvalidArgument, RecordParseError
from .records import parse_json
from .report import Check
from .reportcompute import (
    Learning,
    NotRecomputed,
    header,
    learning,
    serving,
    training,
)
from .reportinputs import Inputs, load_inputs, resources
from .training import parameter_values

REPORT_VERIFIERS = frozenset({"answers", "statistics", "journals", "throughput"})
"""Verifier names of the report recipe's claims."""
LEARNING_CLAIMS = ("documents", "correct.", "gain.", "p.", "p_exact.", "contract.")
TRAINING_CLAIMS = ("median_update_seconds.", "update_seconds.", "update_seconds_ratio.")
SERVING_CLAIMS = ("throughput_ratio", "failure_retries", "identical_outputs", "cache_hits")
PROSE = frozenset({"note", "notes"})
PAGE_FILES = ("report.json", "resources.json", "generations.html")
FIGURE_FORMATS = ("svg", "png", "pdf")
_SHOWN = 5


class ReportRun(Protocol):
    """What this module reads of a receipt under check (``receipts.Run`` provides it)."""

    @property
    def name(self) -> str: ...
    @property
    def receipt(self) -> Mapping[str, Any]: ...
    @property
    def inputs(self) -> Mapping[str, str]: ...
    @property
    def outputs(self) -> Mapping[str, str]: ...
    @property
    def params(self) -> Mapping[str, Any]: ...


class Sink(Protocol):
    """Where findings go (``receipts.Findings``): checks, recomputed claim values, and
    ``section``, which runs one part and turns an unusable object into skipped claims."""

    checks: list[Check]
    values: dict[str, Any]

    def section(self, name: str, claims: tuple[str, ...], work: Callable[[], None]) -> None: ...


def _claims(run: ReportRun, names: tuple[str, ...]) -> tuple[str, ...]:
    """The receipt's claims that a part recomputes (names ending in ``.`` are prefixes)."""
    return tuple(c for c in run.receipt["claims"]
                 if any(c.startswith(n) if n.endswith(".") else c == n for n in names))


def _malformed(what: str, work: Callable[[], None]) -> Callable[[], None]:
    """``work`` with content of the wrong JSON type reported as a finding, not a crash."""
    def run() -> None:
        try:
            work()
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(what, f"malformed content ({exc})") from None
    return run


def check_report(objects: Objects, run: ReportRun, found: Sink) -> None:
    """Every finding about one ``report`` run; recomputed claim values into ``found.values``."""
    name = run.name
    state: dict[str, Any] = {}

    def section(part: str, claims: tuple[str, ...], work: Callable[[], None]) -> None:
        found.section(f"{name}.{part}", _claims(run, claims),
                      _malformed(f"{name} {part}", work))

    def inputs() -> None:
        ins, problems = load_inputs(objects, run.inputs)
        state["inputs"] = ins
        found.checks.append(_listing(f"{name}.inputs", problems, recomputed=len(ins.runs())))

    section("inputs", (*LEARNING_CLAIMS, *TRAINING_CLAIMS, *SERVING_CLAIMS), inputs)
    if "inputs" not in state:
        return
    ins: Inputs = state["inputs"]
    section("files", (), lambda: state.update(_read_outputs(objects, run, ins, found)))
    report: dict[str, Any] | None = state.get("report")

    def compare_json(part: str, mine: dict[str, Any]) -> None:
        if report is None:
            found.checks.append(Check.skipped(f"{name}.json.{part}", "report.json is unusable"))
            return
        claimed = {k: report[k] for k in mine if k in report}
        found.checks.extend(field_checks(f"{name}.json", part, claimed, mine))

    def learn() -> None:
        result = learning(objects, ins)
        state["learning"] = result
        found.values.update(learning_claims(result))
        compare_json("learning", {"learning": result.section, "contract": result.contract})

    def train() -> None:
        result = training(objects, ins)
        state["training"] = result
        for arm, t in (result or {"arms": {}})["arms"].items():
            found.values[f"median_update_seconds.{arm}"] = t["median_update_seconds"]
            found.values[f"update_seconds.{arm}"] = t["update_seconds"]
        for r in (result or {"ratios": []})["ratios"]:
            found.values[f"update_seconds_ratio.{r['pair']}:{r['single']}"] = r["update_seconds"]
        compare_json("training", {"training": result})

    def serve() -> None:
        result = serving(objects, ins)
        if result is not None:
            found.values.update({k: result[k] for k in SERVING_CLAIMS})
        compare_json("serving", {"serving": result})

    def spent() -> None:
        mine = resources(objects, ins, float(run.params.get("price_per_host_hour", 0)))
        compare_json("resources", {"resources": mine})
        if report is not None and "resources_json" in state:
            found.checks.append(Check.verdict(
                f"{name}.resources_json", state["resources_json"] == report.get("resources"),
                message="resources.json is not report.json's resources"))

    section("learning", LEARNING_CLAIMS, learn)
    section("training", TRAINING_CLAIMS, train)
    section("serving", SERVING_CLAIMS, serve)
    section("resources", (), spent)
    section("header", (), lambda: compare_json("header", header(objects, ins, run.params)))
    if report is not None:
        unknown = sorted(set(report) - KNOWN_PARTS)
        if unknown:
            found.checks.append(Check.skipped(f"{name}.json.not_recomputed", "report.json "
                                              f"parts not recomputed here: {unknown}"))

    def page() -> None:
        if "learning" not in state or "page" not in state:
            why = "generations.html is unusable" if "page" not in state else \
                "the learning part was not recomputed"
            found.checks.extend(Check.skipped(f"{name}.page.{c}", why)
                                for c in ("tasks", "answers"))
            return
        found.checks.extend(page_checks(f"{name}.page", state["page"], state["learning"]))

    def weights() -> None:
        check_name = f"{name}.weights"
        if report is None or "learning" not in state:
            found.checks.append(Check.skipped(check_name, "needs report.json and the learning "
                                              "part, which are unusable"))
            return
        check = weights_check(objects, check_name, report, state["learning"],
                              state.get("training"))
        if ins.train and "training" not in state and check.status == "passed":
            check = Check.skipped(check_name, "the training part was not recomputed, so its "
                                  "digests were not rebuilt")
        found.checks.append(check)

    section("page", (), page)
    section("weights", (), weights)


KNOWN_PARTS = frozenset({"format", "title", "inputs", "prepared", "commitment", "learning",
                         "contract", "training", "serving", "resources", "audit"})


def learning_claims(result: Learning) -> dict[str, Any]:
    """The learning claims as the report defines them, from the recomputation."""
    values: dict[str, Any] = {"documents": result.section["documents"]}
    for arm, a in result.section["arms"].items():
        values[f"correct.{arm}"] = a["correct"]
    for arm, paired in result.versus_seed.items():
        values[f"gain.{arm}"] = paired.gain
        values[f"p.{arm}"] = paired.p
        values[f"p_exact.{arm}"] = f"{paired.p.numerator}/{paired.p.denominator}"
        values[f"contract.{arm}"] = result.contract[arm]["passed"]
    return values


def _read_outputs(objects: Objects, run: ReportRun, ins: Inputs, found: Sink) -> dict[str, Any]:
    """The output tree's files checked by name; report.json, resources.json and the page."""
    entries = objects.record_of(run.outputs["report"], "tree/1")["entries"]
    figures = ["comparison", "accuracy", *(["training"] if ins.train else []),
               *(["serving"] if ins.serve is not None else [])]
    expected = {*PAGE_FILES, *(f"{f}.{x}" for f in figures for x in FIGURE_FORMATS)}
    missing, extra = sorted(expected - set(entries)), sorted(set(entries) - expected)
    found.checks.append(Check.verdict(
        f"{run.name}.files", not missing and not extra, claimed=sorted(entries),
        recomputed=sorted(expected), message=f"missing {missing}, unexpected {extra}"))
    out: dict[str, Any] = {}
    for key, path in (("report", "report.json"), ("resources_json", "resources.json")):
        if path in entries:
            try:
                out[key] = parse_json(objects.bytes(entries[path]["id"]), what=path)
            except RecordParseError as exc:
                found.checks.append(Check.failed(f"{run.name}.files.{path}", exc.message))
    if not isinstance(out.get("report"), dict):
        out.pop("report", None)
    if "generations.html" in entries:
        try:
            out["page"] = objects.bytes(entries["generations.html"]["id"]).decode("utf-8")
        except UnicodeDecodeError as exc:
            found.checks.append(Check.failed(f"{run.name}.files.generations.html",
                                             f"not UTF-8 text ({exc})"))
    return out


@dataclass(slots=True)
class _Fields:
    prefix: str
    compared: int = 0
    failed: list[Check] = field(default_factory=list)
    not_recomputed: list[str] = field(default_factory=list)

    def walk(self, claimed: Any, mine: Any, path: str) -> None:
        if isinstance(mine, NotRecomputed):
            self.not_recomputed.append(f"{path} ({mine.why})")
        elif isinstance(claimed, dict) and isinstance(mine, dict):
            for key in sorted(set(claimed) | set(mine), key=str):
                sub = f"{path}.{key}" if path else str(key)
                if key not in mine:
                    if key not in PROSE:
                        self.not_recomputed.append(sub)
                elif key not in claimed:
                    self.failed.append(Check.failed(f"{self.prefix}.{sub}", "report.json lacks "
                                                    "this field", recomputed=mine[key]))
                else:
                    self.walk(claimed[key], mine[key], sub)
        elif isinstance(claimed, list) and isinstance(mine, list):
            if len(claimed) != len(mine):
                self.failed.append(Check.failed(
                    f"{self.prefix}.{path}", f"report.json lists {len(claimed)} items, "
                    f"recomputed {len(mine)}", claimed=len(claimed), recomputed=len(mine)))
            for index, (a, b) in enumerate(zip(claimed, mine, strict=False)):
                self.walk(a, b, f"{path}[{index}]")
        else:
            found = differences(claimed, mine)
            if found:
                why = "; ".join(f.removeprefix("$: ") for f in found[:_SHOWN])
                self.failed.append(Check.failed(f"{self.prefix}.{path}", "report.json differs "
                                                f"from the recomputation: {why}",
                                                claimed=claimed, recomputed=mine))
            else:
                self.compared += 1


def field_checks(prefix: str, part: str, claimed: dict[str, Any],
                 mine: dict[str, Any]) -> list[Check]:
    """One failed check per differing field of ``claimed`` (report.json's top-level members
    of ``part``), else one passed check for the part; a skipped one lists what is not
    recomputed."""
    fields = _Fields(prefix=prefix)
    fields.walk(claimed, mine, "")
    checks = fields.failed or [Check.passed(f"{prefix}.{part}",
                                            recomputed=f"{fields.compared} fields equal")]
    if fields.not_recomputed:
        checks.append(Check.skipped(f"{prefix}.{part}.not_recomputed", "not recomputed: "
                                    + "; ".join(fields.not_recomputed)))
    return checks


def page_checks(prefix: str, page: str, result: Learning) -> list[Check]:
    """generations.html names every test task and shows every arm's answer."""
    absent = [i for i in result.test_ids if escape(i, quote=True) not in page]
    answers = [f"{arm} answer to {result.test_ids[n][:12]}"
               for arm, s in result.scored.items()
               for n, g in enumerate(s.generations)
               if escape(str(g.get("text", "")), quote=True) not in page]
    return [_listing(f"{prefix}.tasks", [f"task {i} is absent" for i in absent],
                     recomputed=len(result.test_ids)),
            _listing(f"{prefix}.answers", [f"{a} is absent" for a in answers],
                     recomputed=sum(len(s.generations) for s in result.scored.values()))]


def _at(value: Any, *path: str) -> Any:
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def weights_check(objects: Objects, name: str, report: dict[str, Any], result: Learning,
                  trained: dict[str, Any] | None) -> Check:
    """Digests report.json names against the ones rebuilt from the weight files."""
    wanted: list[tuple[str, str, str, Any]] = []  # (what, checkpoint, value kind, claimed)
    for arm, a in result.section["arms"].items():
        wanted.append((f"learning.arms.{arm}.parameter_digest", a["model"], "parameter_digest",
                       _at(report, "learning", "arms", arm, "parameter_digest")))
    for arm, t in (trained or {"arms": {}})["arms"].items():
        wanted.append((f"training.arms.{arm}.final_parameters_blake3", t["checkpoint"],
                       "agreed_parameters",
                       _at(report, "training", "arms", arm, "final_parameters_blake3")))
    problems, unavailable = [], []
    for what, checkpoint, kind, claimed in wanted:
        values, skipped = parameter_values(objects, checkpoint)
        if kind not in values:
            unavailable.append(f"{what}: {skipped.get(kind, 'not rebuilt')}")
        elif values[kind] != claimed:
            problems.append(f"{what} is not the digest of {checkpoint}'s weights")
    if problems:
        return _listing(name, problems, recomputed=len(wanted))
    if unavailable:
        return Check.skipped(name, "cannot rebuild from weights: " + "; ".join(unavailable))
    return Check.passed(name, recomputed=f"{len(wanted)} digests rebuilt")


def _listing(name: str, problems: list[str], *, recomputed: Any = None) -> Check:
    if not problems:
        return Check.passed(name, recomputed=recomputed)
    more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
    return Check.failed(name, f"{len(problems)} problem(s): " + "; ".join(problems[:_SHOWN])
                        + more, recomputed=recomputed)
