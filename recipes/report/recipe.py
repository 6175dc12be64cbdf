"""Recipe ``report``: the experiment's report recomputed from retained objects (docs/experiment.md §6).

Inputs are receipts named by role: ``prepare``, ``commit``, ``train.<arm>``,
``evaluate.<arm>`` (``evaluate.seed`` is the baseline) and ``serve``. Output ``report`` is a
tree of ``report.json``, ``resources.json``, ``index.html`` (the summary page, drawn from
report.json alone), ``generations.html`` and figures (``comparison``, ``accuracy``,
``training``, ``serving``, ``parameters``; each ``.svg``, ``.png``, ``.pdf``, drawn from report.json's
``figures`` and carrying that data in its own metadata). Every file is a deterministic
function of the inputs and the action ID (which report.json, index.html and every figure
show), so a rerun is ``identical``.

Version 2 added index.html, report.json's ``action`` and ``parameters`` (the distance
between the compared arms' weights, by the ``--rerun`` verdict's ``nscas.models.distance``),
version-2 figure data (a fixed arm
colour map, 0..1 axes with a note when every value is zero, the action ID in a corner) and
compact runs of blank lines on the answer page; the verifiers still check version-1 runs by
the version-1 definitions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.runs.recipe import BundleRole, Claim, InputSpec, Recipe, RecipeResult, RunContext

if TYPE_CHECKING:
    from nscas.store.protocol import ObjectReader

    from .compute import Report

VERSION = "2"
REPORT_FILE = "report.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportParams:
    price_per_host_hour: float = 0.0
    """Price of one host for one hour, for the cost estimate; 0 means none given, no estimate."""
    title: str = "Cooperative learning, recomputed"
    """Heading of report.json, of the summary page and of the generations page."""

    def validate(self) -> str | None:
        if not math.isfinite(self.price_per_host_hour) or self.price_per_host_hour < 0:
            return ("price_per_host_hour must be a finite number >= 0, "
                    f"got {self.price_per_host_hour}")
        if not self.title.strip():
            return "title must not be empty"
        return None


def write_json(path: Path, value: Any) -> None:
    text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def headline_claims(report: Report) -> dict[str, Claim]:
    """The numbers a reader quotes, each naming the verifier that rechecks it."""
    learning = report.learning
    claims = {"documents": Claim(value=learning.documents, verifier="answers")}
    for arm, a in learning.arms.items():
        claims[f"correct.{arm}"] = Claim(value=a.correct, verifier="answers")
    for c in learning.comparisons:
        if c.kind != "versus_seed" or c.contract is None:
            continue
        arm = c.candidate
        numbers = c.paired.to_dict()
        claims[f"gain.{arm}"] = Claim(value=numbers["gain"], verifier="statistics")
        claims[f"p.{arm}"] = Claim(value=numbers["p"], verifier="statistics")
        claims[f"p_exact.{arm}"] = Claim(value=numbers["p_exact"], verifier="statistics")
        claims[f"contract.{arm}"] = Claim(value=c.contract["passed"], verifier="statistics")
    if report.training is not None:
        for arm, t in report.training.arms.items():
            claims[f"median_update_seconds.{arm}"] = Claim(value=t.head.median_update_seconds,
                                                           verifier="journals")
            claims[f"update_seconds.{arm}"] = Claim(value=t.head.update_seconds,
                                                    verifier="journals")
        for r in report.training.ratios:
            claims[f"update_seconds_ratio.{r.pair}:{r.single}"] = Claim(
                value=r.update_seconds, verifier="journals")
    if report.serving is not None:
        s = report.serving
        for name in ("throughput_ratio", "failure_retries", "identical_outputs", "cache_hits"):
            claims[name] = Claim(value=getattr(s, name), verifier="throughput")
    return claims


def run(ctx: RunContext) -> RecipeResult:
    from .compute import compute
    from .figures import write_figures
    from .index import render_index
    from .page import render_page

    p: ReportParams = ctx.params
    if ctx.action is None:
        raise RecipeError("the report shows its own action ID, so it runs only as an action "
                          "(through the runner)")
    ctx.progress.start(None, "recomputing the report from retained objects")
    scratch = ctx.workdir / "journals"
    scratch.mkdir()
    computed = compute(ctx.store, ctx.inputs, title=p.title, action=ctx.action,
                       price_per_host_hour=p.price_per_host_hour, scratch=scratch)
    out = ctx.workdir / "report"
    out.mkdir()
    report = computed.report
    write_json(out / REPORT_FILE, report.to_json())
    written = json.loads((out / REPORT_FILE).read_text(encoding="utf-8"))
    (out / "index.html").write_text(render_index(written), encoding="utf-8")
    write_json(out / "resources.json", report.resources.to_json())
    page = render_page(p.title, report.learning.arms, computed.tests, computed.scored)
    (out / "generations.html").write_text(page, encoding="utf-8")
    ctx.progress.note("drawing figures")
    write_figures(report.figures, out)
    tree = ctx.store.put_tree(out)
    return RecipeResult(outputs={"report": tree}, claims=headline_claims(report))


MEASURED_SECTIONS = frozenset({"resources", "figures"})
"""Members of ``report.json`` that are measurements through and through: the runs' wall and
device time, and the figures' data (drawn from the rest, the timing panels included)."""
MEASURED_NAMES = frozenset({"throughput_ratio", "claimed_only"})
"""Members measured wherever they sit, besides every ``*seconds`` and ``*_per_second``:
the serving speed-up, and what a train run says of its own loop time and memory."""
RECEIPT = "<receipt>"
ACTION = "<action>"


def _measured(name: str) -> bool:
    return name.endswith(("seconds", "_per_second")) or name in MEASURED_NAMES


def reproducible_report(store: ObjectReader, oid: Digest) -> Any:
    """What a rerun of ``report`` must reproduce: ``report.json`` without its measurements
    and with every input receipt's ID replaced by ``<receipt>`` (a rerun's receipts differ in
    their times, so their IDs do) and its own action ID by ``<action>`` (an action names its
    inputs: the same on a ``--rerun`` of the same receipts, another one when they were rerun
    too). Figures and pages are drawn from ``report.json`` and the action ID. The
    ``parameters`` part stays: its distances are a function of the committed weights, which
    a rerun reads again, not a measurement."""
    tree = store.get_record(oid)
    report = json.loads(store.get_bytes(Digest.parse(tree["entries"][REPORT_FILE]["id"])))
    receipts = set(report["inputs"].values())
    action = report.get("action")

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if not _measured(k)}
        if isinstance(value, list):
            return [strip(v) for v in value]
        if isinstance(value, str) and value == action:
            return ACTION
        return RECEIPT if isinstance(value, str) and value in receipts else value

    return strip({k: v for k, v in report.items() if k not in MEASURED_SECTIONS})


RECIPE = Recipe(
    name="report",
    version=VERSION,
    params=ReportParams,
    inputs={
        "prepare": InputSpec(kind="receipt/1", doc="the prepare receipt"),
        "commit": InputSpec(kind="receipt/1", doc="the commit receipt that fixed the candidates"),
        "evaluate.seed": InputSpec(kind="receipt/1", doc="the baseline (seed) evaluation"),
        "serve": InputSpec(kind="receipt/1", required=False, doc="the serve receipt"),
    },
    outputs=("report",),
    run=run,
    measurements={"report": reproducible_report},
    bundle=BundleRole(folder="report"),
    extra_inputs=True,
    extra_kind="receipt/1",
    doc="Recompute the experiment's report (learning, training, serving, resources), its "
        "summary page, figures and the every-answer page from retained objects; claims are "
        "audited.",
)
