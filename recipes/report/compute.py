"""The report JSON, computed only from retained objects (docs/experiment.md §6).

``compute`` reads the input receipts and the objects they link (task records, generations,
checks, retention losses, journals, the request log, environments, receipt times) and
writes nothing to the store. Every value a step also claimed is recomputed and audited; a
single disagreement stops the report with a ``ClaimMismatch`` naming both values, so a report
that exists had no mismatch (and says nothing more about its audit: every member of
report.json is one a verifier recomputes). ``figures`` holds exactly what each figure draws.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nscas.digests import Digest

from .audit import Audit
from .evidence import BASELINE, Evidence, jsonl, load_evidence
from .figures import figure_data
from .learning import FinalTest, Scored, arm_summary, comparisons, load_final_test, score
from .resources import resources_section
from .serving import serving_section
from .training import training_section

REPORT_FORMAT = "nscas-report/2"
"""Version 2: a ``figures`` part (what each figure draws); no ``audit`` part."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Computed:
    """The report JSON and what the figures and the generations page are drawn from."""

    report: dict[str, Any]
    evidence: Evidence
    tests: FinalTest
    scored: Mapping[str, Scored]
    """Rescored answers by arm, in report order (the baseline first)."""


def compute(store: Any, inputs: Mapping[str, Digest], *, title: str,
            price_per_host_hour: float, scratch: Path) -> Computed:
    """The report of the experiment whose receipts are ``inputs`` (names as in ``evidence``)."""
    audit = Audit()
    ev = load_evidence(store, inputs)
    tests = load_final_test(store, ev)
    scored = {arm: score(store, arm, run, tests, audit) for arm, run in ev.evaluate.items()}
    arms = {arm: arm_summary(store, ev, s, tests, audit) for arm, s in scored.items()}
    compared, contracts = comparisons(ev, scored, tests, audit)
    prepared = prepared_section(store, ev, audit)
    training = training_section(store, ev, scratch, audit)
    serving = serving_section(store, ev, audit)
    resources = resources_section(ev, price_per_host_hour)
    audit.raise_if_any()
    commitment = ev.commit.output("commitment")
    report = {
        "format": REPORT_FORMAT,
        "title": title,
        "inputs": {run.name: str(run.receipt) for run in ev.runs()},
        "prepared": prepared,
        "commitment": {"id": str(commitment),
                       "subjects": store.get_record(commitment)["subjects"]},
        "learning": {
            "baseline": BASELINE,
            "documents": len(tests.records),
            "held_out_variants": list(tests.held_out),
            "arms": arms,
            "comparisons": compared,
        },
        "contract": contracts,
        "training": training,
        "serving": serving,
        "resources": resources,
    }
    report["figures"] = figure_data(report)
    return Computed(report=report, evidence=ev, tests=tests, scored=scored)


def prepared_section(store: Any, ev: Evidence, audit: Audit) -> dict[str, Any]:
    """Sizes of the prepared sets and the damaged-target count, from their records."""
    prepare = ev.prepare
    records = {}
    sets = {}
    for name in ("test", "dev", "train", "damaged", "replay", "retention"):
        oid = prepare.output(name)
        rec = store.get_record(oid)
        lines = jsonl(store.get_bytes(Digest.parse(rec["records"])), f"prepared {name} records")
        records[name] = lines
        sets[name] = {"id": str(oid), "count": len(lines)}
        if "standin" in rec:
            sets[name]["standin"] = rec["standin"]
    clean = {r["id"]: r["target"] for r in records["train"]}
    damaged = sum(1 for r in records["damaged"] if clean.get(r["id"]) != r["target"])
    audit.claim(prepare, "counts", {k: sets[k]["count"] for k in ("test", "dev", "train")})
    audit.claim(prepare, "damaged_count", damaged)
    audit.claim(prepare, "replay_count", sets["replay"]["count"])
    audit.claim(prepare, "retention_count", sets["retention"]["count"])
    return {"receipt": str(prepare.receipt), "prepared": str(prepare.output("prepared")),
            "sets": sets, "damaged_targets": damaged}
