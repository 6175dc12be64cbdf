"""``report`` receipts rechecked (docs/experiment.md §6): every headline claim, every member of
report.json, every number and verdict of the answer page and the data of every figure file,
recomputed from the retained objects by ``compute``, ``page`` and
``figures``.

Checks, each named ``report.<8 hex>.<what>``:

- ``inputs``: the input receipts describe one experiment (rules in ``inputs``);
- ``version``: the run is of report@1 or report@2, the versions defined here (each checked by
  its own definitions: report@1 has no index.html and version-1 figures and page);
- ``files``: the output tree holds exactly report.json, resources.json, generations.html
  (report@2: and index.html) and each figure the report has data for as SVG, PNG and PDF;
- ``json.<part>`` for the parts ``learning`` (with ``contract``), ``training``, ``serving``,
  ``resources``, ``figures`` and ``header`` (format, title, inputs, prepared sets,
  commitment): passed when every recomputed member equals report.json's. Otherwise each
  differing member is its own failed check ``json.<path>``
  (``json.learning.arms.seed.correct``, ``json.learning.comparisons[0].wins``); a member
  report.json holds that is not recomputed is a failed ``json.<path>`` too. Prose
  (``note``, ``notes``) is fixed text, regenerated and compared exactly;
- report@2: ``json.parameters``: the ``parameters`` part (each compared pair's relative L2
  difference, maximum absolute difference and bit-identical tensors, over all parameters, per
  layer and per tensor) recomputed from the checkpoints' safetensors files by ``paramdiff``,
  streamed; floats within ``float_recomputation`` (float64 sums of the same values in another
  order), counts, names and ``identical`` exactly. Skipped (``needs="weights"``), never
  passed, when the bundle omitted the weights: the figure and the summary page are then
  checked against report.json's own, unrechecked ``parameters``;
- ``json.parts``: report.json has exactly the known top-level parts (an unknown part fails);
- ``resources_json``: resources.json holds what report.json's ``resources`` must hold;
- ``figures.<name>.<format>``: the figure file (``training.png``) carries, in its own
  metadata, exactly the recomputed data of that figure (``figures``);
- ``page.headline``, ``page.filters``, ``page.tasks``, ``page.verdicts``, ``page.answers``
  and ``page.exact``: generations.html is, part by part and then byte for byte, the page
  rendered from the recomputation (``page``);
- report@2: ``index.head``, ``index.<section>`` for each section of ``index.SECTIONS``
  and ``index.exact``: index.html is, part by part and then byte for byte, the summary page
  rendered from the recomputation (with report.json's own value wherever it is equal to the
  recomputed one under the rules below, so a float is shown as the report printed it) and
  the receipt's action ID (``index``);
- ``weights``: the parameter digests report.json names are the ones rebuilt from the
  checkpoints' weight files; skipped (``needs="weights"``), never passed, when the bundle
  omitted the weights, failed when they cannot be rebuilt for any other reason.

Comparison rules (docs/format.md §7): booleans, strings and null are equal only when identical;
integers only to integers, exactly (a count ``0.000000000001`` is not ``0``); a value the
verifiers hold as an exact rational (accuracy, gain, p, bytes per update) only as that
rational's correctly rounded float (or the integer it equals); values copied from the
journals (losses, learning rates, gradient norms) exactly; any other float within the
tolerance ``float_recomputation`` (relative ``REL_TOL``, absolute ``ABS_TOL``), since the
verifiers may sum the same floats in another order. The claims of a report receipt are
decided here with the same rules; ``p_exact.<arm>`` must be the recomputed rational's
``numerator/denominator`` and ``p.<arm>`` its correctly rounded float.

Each part runs on its own: an unusable object fails that part and its claims, not the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from ..core.errors import InvalidArgument, RecordParseError, VerifierError
from ..core.results import Check
from ..records.closure import Objects, Unusable, weights_omitted
from ..records.reading import parse_json
from ..training.checkpoints import parameter_values
from ..training.paramdiff import parameters as parameter_distances
from .compute import Learning, header, learning, learning_claims, serving, training
from .figures import FIGURE_FORMATS, FigureError, embedded, figure_data
from .index import PARTS as INDEX_PARTS
from .index import compare_index, render_index
from .inputs import BASELINE, Inputs, load_inputs, resources
from .page import PARTS, Answer, Task, compare_pages, render
from .strict import INEXACT_KEYS, SHOWN, field_checks, listing, settle, strict_problems

REPORT_VERIFIERS = frozenset({"answers", "statistics", "journals", "throughput"})
"""Verifier names of the report recipe's claims."""


LEARNING_CLAIMS = ("documents", "correct.", "gain.", "p.", "p_exact.", "contract.")


TRAINING_CLAIMS = ("median_update_seconds.", "update_seconds.", "update_seconds_ratio.")


SERVING_CLAIMS = ("throughput_ratio", "failure_retries", "identical_outputs", "cache_hits")


PAGE_FILES = ("report.json", "resources.json", "generations.html")


INDEX_FILE = "index.html"


FILE_FORMATS = ("svg", "png", "pdf")


VERSIONS = (1, 2)
"""The report recipe versions defined here."""


KNOWN_PARTS = frozenset({"format", "title", "inputs", "prepared", "commitment", "learning",
                         "contract", "training", "serving", "resources", "figures"})
"""report.json's top-level members in report@1 (format ``nscas-report/2``); report@2
(``nscas-report/3``) adds ``action`` and ``parameters``."""


class ReportRun(Protocol):
    """What this module reads of a receipt under check (``core.runs.Run`` provides it)."""

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
    @property
    def action(self) -> Mapping[str, Any]: ...


class Sink(Protocol):
    """Where findings go (``records.claims.Findings``): checks, claims decided here (by claim
    name), and ``section``, which runs one part and turns an unusable object into a failed
    part and failed claims."""

    checks: list[Check]
    values: dict[str, Any]
    decided: dict[str, Check]

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
        except (TypeError, ValueError, AttributeError, IndexError, OverflowError,
                ZeroDivisionError) as exc:
            raise InvalidArgument(what, f"malformed content ({type(exc).__name__}: {exc})"
                                  ) from None
    return run


def _decide(run: ReportRun, found: Sink, values: Mapping[str, Any]) -> None:
    """Decide each of the receipt's claims among ``values`` under the strict rules."""
    claims = run.receipt["claims"]
    for claim, mine in values.items():
        if claim not in claims:
            continue
        claimed = claims[claim]["value"]
        name = f"{run.name}.claims.{claim}"
        problems = strict_problems(claimed, mine)
        found.decided[claim] = (
            Check.passed(name, claimed=claimed, recomputed=mine) if not problems else
            Check.failed(name, "claimed value differs from the recomputation: "
                         + "; ".join(problems[:SHOWN]), claimed=claimed, recomputed=mine))


def recipe_version(run: ReportRun) -> int | None:
    """The report recipe version of the run's action, or None when it is not one defined."""
    version = str(run.action.get("recipe", "")).partition("@")[2]
    return int(version) if version in {str(v) for v in VERSIONS} else None


def known_parts(version: int) -> frozenset[str]:
    return KNOWN_PARTS | {"action", "parameters"} if version >= 2 else KNOWN_PARTS


def check_report(objects: Objects, run: ReportRun, found: Sink) -> None:
    """Every finding about one ``report`` run; its claims decided into ``found.decided``."""
    name = run.name
    state: dict[str, Any] = {}
    version = recipe_version(run)
    found.checks.append(Check.verdict(
        f"{name}.version", version is not None, claimed=run.action.get("recipe"),
        recomputed=[f"report@{v}" for v in VERSIONS],
        message="no verifier defines this version of the report recipe, so its outputs are "
                "not rechecked"))
    if version is None:
        return
    action = str(run.receipt["action"])

    def section(part: str, claims: tuple[str, ...], work: Callable[[], None]) -> None:
        found.section(f"{name}.{part}", _claims(run, claims),
                      _malformed(f"{name} {part}", work))

    def inputs() -> None:
        ins, problems = load_inputs(objects, run.inputs)
        state["inputs"] = ins
        found.checks.append(listing(f"{name}.inputs", problems, recomputed=len(ins.runs())))

    section("inputs", (*LEARNING_CLAIMS, *TRAINING_CLAIMS, *SERVING_CLAIMS), inputs)
    if "inputs" not in state:
        return
    ins: Inputs = state["inputs"]
    section("files", (), lambda: state.update(_read_outputs(objects, run, ins, found,
                                                            version)))
    report: dict[str, Any] | None = state.get("report")

    def compare_json(part: str, mine: dict[str, Any]) -> None:
        state.setdefault("mine", {}).update(mine)
        if report is None:
            found.checks.append(Check.failed(f"{name}.json.{part}", "report.json is unusable, "
                                             "so this part cannot be compared"))
            return
        claimed = {k: report[k] for k in mine if k in report}
        found.checks.extend(field_checks(f"{name}.json", part, claimed, mine))

    def learn() -> None:
        result = learning(objects, ins)
        state["learning"] = result
        _decide(run, found, learning_claims(result))
        compare_json("learning", {"learning": result.section, "contract": result.contract})

    def train() -> None:
        result = training(objects, ins)
        state["training"] = result
        values: dict[str, Any] = {}
        for arm, t in (result or {"arms": {}})["arms"].items():
            values[f"median_update_seconds.{arm}"] = t["median_update_seconds"]
            values[f"update_seconds.{arm}"] = t["update_seconds"]
        for r in (result or {"ratios": []})["ratios"]:
            values[f"update_seconds_ratio.{r['pair']}:{r['single']}"] = r["update_seconds"]
        _decide(run, found, values)
        compare_json("training", {"training": result})

    def serve() -> None:
        result = serving(objects, ins)
        state["serving"] = result
        if result is not None:
            _decide(run, found, {k: result[k] for k in SERVING_CLAIMS})
        compare_json("serving", {"serving": result})

    def spent() -> None:
        mine = resources(objects, ins, float(run.params.get("price_per_host_hour", 0)))
        compare_json("resources", {"resources": mine})
        if "resources_json" in state:
            problems = strict_problems(state["resources_json"], mine)
            found.checks.append(listing(f"{name}.resources_json", problems))

    def params() -> None:
        _parameters(name, objects, report, state, compare_json, found)

    section("learning", LEARNING_CLAIMS, learn)
    if version >= 2:
        section("parameters", (), params)
    section("training", TRAINING_CLAIMS, train)
    section("serving", SERVING_CLAIMS, serve)
    section("resources", (), spent)
    section("header", (), lambda: compare_json("header", header(
        objects, ins, run.params, version=version, action=action)))
    section("figures", (), lambda: _figures(name, ins, state, compare_json, found, version,
                                            action))
    parts = known_parts(version)
    if report is not None:
        extra, missing = sorted(set(report) - parts), sorted(parts - set(report))
        found.checks.append(Check.verdict(
            f"{name}.json.parts", not extra and not missing, claimed=sorted(report),
            recomputed=sorted(parts),
            message=f"report.json has parts no verifier recomputes {extra[:SHOWN]}"
                    f"{' and lacks parts ' + str(missing) if missing else ''}"))
    else:
        found.checks.append(Check.failed(f"{name}.json.parts", "report.json is unusable"))
    section("page", (), lambda: _page(name, run, state, found, version))
    if version >= 2:
        section("index", (), lambda: _index(name, ins, action, state, found))

    def weights() -> None:
        check_name = f"{name}.weights"
        if report is None or "learning" not in state:
            found.checks.append(Check.failed(check_name, "needs report.json and the learning "
                                             "part, which are unusable"))
            return
        check = weights_check(objects, check_name, report, state["learning"],
                              state.get("training"))
        if ins.train and "training" not in state and check.status != "failed":
            check = Check.failed(check_name, "the training part was not recomputed, so its "
                                 "digests were not rebuilt")
        found.checks.append(check)

    section("weights", (), weights)


def _parameters(name: str, objects: Objects, report: dict[str, Any] | None,
                state: dict[str, Any], compare_json: Callable[[str, dict[str, Any]], None],
                found: Sink) -> None:
    """report.json's ``parameters``, recomputed from the compared arms' weights; without the
    omitted weights, skipped, and report.json's own part kept for the figure and the page."""
    check = f"{name}.json.parameters"
    result: Learning | None = state.get("learning")
    if result is None:
        found.checks.append(Check.failed(check, "the learning part (the compared arms and "
                                         "their checkpoints) was not recomputed"))
        return
    models = {arm: a["model"] for arm, a in result.section["arms"].items()}
    try:
        mine = parameter_distances(objects, models, result.section["comparisons"])
    except Unusable as exc:
        if exc.needs is None:
            found.checks.append(Check.failed(check, f"the weights cannot be compared: "
                                             f"{exc.object_id} is unusable: {exc.why}"))
            return
        found.checks.append(Check.skipped(
            check, f"needs the omitted weights: {exc.object_id} is unusable: {exc.why}",
            needs=exc.needs))
        own = report.get("parameters") if report is not None else None
        if isinstance(own, dict) and isinstance(own.get("pairs"), list):
            state["parameters"] = own
            state.setdefault("mine", {})["parameters"] = own
        return
    except VerifierError as exc:  # checkpoints of different models, a truncated file
        found.checks.append(Check.failed(check, exc.message))
        return
    state["parameters"] = mine
    compare_json("parameters", {"parameters": mine})


def _figures(name: str, ins: Inputs, state: dict[str, Any],
             compare_json: Callable[[str, dict[str, Any]], None], found: Sink, version: int,
             action: str) -> None:
    """report.json's ``figures`` and every figure file's own copy of its data."""
    absent = [part for part, needed in (("learning", True), ("training", bool(ins.train)),
                                        ("serving", ins.serve is not None))
              if needed and state.get(part) is None]
    files: dict[str, bytes] = state.get("figure_files", {})
    if absent:
        why = f"the {', '.join(absent)} part(s) were not recomputed"
        found.checks.append(Check.failed(f"{name}.json.figures", why))
        found.checks.extend(Check.failed(f"{name}.figures.{stem}", why) for stem in files)
        return
    result: Learning = state["learning"]
    if version >= 2 and "parameters" not in state:
        why = "the parameters part was neither recomputed nor readable from report.json"
        found.checks.append(Check.failed(f"{name}.json.figures", why))
        found.checks.extend(Check.failed(f"{name}.figures.{stem}", why) for stem in files)
        return
    mine = figure_data(result.section, state.get("training"), state.get("serving"),
                       version=version, action=action, parameters=state.get("parameters"))
    compare_json("figures", {"figures": mine})
    for stem, data in files.items():
        figure, _, fmt = stem.rpartition(".")
        check_name = f"{name}.figures.{stem}"
        if figure not in mine:
            found.checks.append(Check.failed(check_name, "no figure of this name is drawn"))
            continue
        try:
            carried = embedded(fmt, data)
        except FigureError as exc:
            found.checks.append(Check.failed(check_name, f"{stem} does not carry its figure "
                                             f"data: {exc}"))
            continue
        want = {"format": FIGURE_FORMATS[version], "figure": figure, "data": mine[figure]}
        problems = strict_problems(carried, want,
                                   exact=None if figure in INEXACT_KEYS else False)
        found.checks.append(listing(check_name, [f"{stem} {p}" for p in problems],
                                     recomputed=f"{figure} data"))


def _page(name: str, run: ReportRun, state: dict[str, Any], found: Sink,
          version: int) -> None:
    checks = [f"{name}.page.{part}" for part in (*PARTS, "exact")]
    if "learning" not in state or "page" not in state:
        why = "generations.html is unusable" if "page" not in state else \
            "the learning part was not recomputed"
        found.checks.extend(Check.failed(c, why) for c in checks)
        return
    result: Learning = state["learning"]
    tasks = page_tasks(result)
    title = run.params.get("title")
    expected = render(str(title), result.section["arms"], tasks, result.held_out,
                      version=version)
    problems, same = compare_pages(state["page"], expected, tasks)
    for part in (*PARTS, "exact"):
        found.checks.append(listing(f"{name}.page.{part}", problems[part],
                                     recomputed="byte for byte" if same else None))


INDEX_NEEDS = ("format", "title", "action", "inputs", "prepared", "commitment", "learning",
               "contract", "training", "serving", "parameters", "resources", "figures")


def _index(name: str, ins: Inputs, action: str, state: dict[str, Any], found: Sink) -> None:
    """index.html against the page rendered from the recomputed report (report.json's own
    values where they are equal to it) with the receipt's action ID."""
    checks = [f"{name}.index.{part}" for part in (*INDEX_PARTS, "exact")]
    mine = state.get("mine", {})
    absent = [part for part in INDEX_NEEDS if part not in mine]
    if "index" not in state or absent:
        why = ("index.html is unusable" if "index" not in state else
               f"the report part(s) {', '.join(absent)} were not recomputed")
        found.checks.extend(Check.failed(c, why) for c in checks)
        return
    shown = settle(state.get("report"), {k: mine[k] for k in INDEX_NEEDS})
    expected = render_index({**shown, "action": action})
    problems, same = compare_index(state["index"], expected)
    for part in (*INDEX_PARTS, "exact"):
        found.checks.append(listing(f"{name}.index.{part}", problems[part],
                                     recomputed="byte for byte" if same else None))


def page_tasks(result: Learning) -> list[Task]:
    """Every test task with every arm's retained answer and the verifiers' verdict."""
    tasks = []
    for n, line in enumerate(result.tests):
        answers = {arm: Answer(text=str(s.generations[n].get("text", "")),
                               correct=s.results[n].correct, reason=str(s.results[n].reason))
                   for arm, s in result.scored.items()}
        tasks.append(Task(id=line["id"], family=line["task"]["family"],
                          variant=line["task"]["variant"], prompt=line["prompt"],
                          target=line["target"], answers=answers))
    return tasks


def _read_outputs(objects: Objects, run: ReportRun, ins: Inputs, found: Sink,
                  version: int) -> dict[str, Any]:
    """The output tree's files checked by name; report.json, resources.json, the pages and
    the figure files' bytes."""
    entries = objects.record_of(run.outputs["report"], "tree/1")["entries"]
    compared = any(arm != BASELINE for arm in ins.evaluate)
    figures = ["comparison", "accuracy", *(["training"] if ins.train else []),
               *(["serving"] if ins.serve is not None else []),
               *(["parameters"] if version >= 2 and compared else [])]
    pages = {*PAGE_FILES, *([INDEX_FILE] if version >= 2 else [])}
    expected = {*pages, *(f"{f}.{x}" for f in figures for x in FILE_FORMATS)}
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
    if "report" in out and not isinstance(out["report"], dict):
        found.checks.append(Check.failed(f"{run.name}.files.report.json",
                                         "report.json is not a JSON object"))
        out.pop("report")
    for key, path in (("page", "generations.html"), ("index", INDEX_FILE)):
        if path in entries and path in pages:
            try:
                out[key] = objects.bytes(entries[path]["id"]).decode("utf-8")
            except UnicodeDecodeError as exc:
                found.checks.append(Check.failed(f"{run.name}.files.{path}",
                                                 f"not UTF-8 text ({exc})"))
    out["figure_files"] = {f"{f}.{x}": objects.bytes(entries[f"{f}.{x}"]["id"])
                           for f in figures for x in FILE_FORMATS if f"{f}.{x}" in entries}
    return out


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
    problems, omitted = [], []
    for what, checkpoint, kind, claimed in wanted:
        values, skipped = parameter_values(objects, checkpoint)
        if kind not in values:
            why = skipped.get(kind, "not rebuilt")
            if weights_omitted(objects, checkpoint):  # the one legal skip
                omitted.append(f"{what}: {why}")
            else:
                problems.append(f"{what} cannot be rebuilt from {checkpoint}'s weights: {why}")
        elif values[kind] != claimed:
            problems.append(f"{what} is not the digest of {checkpoint}'s weights")
    if problems:
        return listing(name, problems, recomputed=len(wanted))
    if omitted:
        return Check.skipped(name, "needs the omitted weights: " + "; ".join(omitted[:SHOWN]),
                             needs="weights")
    return Check.passed(name, recomputed=f"{len(wanted)} digests rebuilt")
