"""The report JSON, computed only from retained objects (docs/experiment.md §6).

``compute`` reads the input receipts and the objects they link (task records, generations,
checks, retention losses, journals, the request log, environments, receipt times, the
compared arms' weights) and writes nothing to the store. Every value a step also claimed is recomputed and audited; a
single disagreement stops the report with a ``ClaimMismatch`` naming both values, so a report
that exists had no mismatch (and says nothing more about its audit: every member of
report.json is one a verifier recomputes). ``figures`` holds exactly what each figure draws.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nscas.objects.digests import Digest
from nscas.store.protocol import ObjectReader

from .audit import Audit
from .evidence import BASELINE, Evidence, jsonl, load_evidence
from .figures import FigureData, figure_data
from .learning import (
    FinalTest,
    Learning,
    Scored,
    arm_summary,
    comparisons,
    load_final_test,
    score,
)
from .parameters import Parameters, parameters_section
from .resources import Resources, resources_section
from .serving import Serving, serving_section
from .training import Training, training_section

REPORT_FORMAT = "nscas-report/3"
"""Version 3 (report@2): an ``action`` member (the report's own action ID, which index.html
and every figure show), a ``parameters`` part (the compared arms' parameter distances) and
version-2 figure data. Version 2 (report@1): a ``figures`` part
(what each figure draws); no ``audit`` part."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedSet:
    """One prepared task set: its ID and size."""

    id: Digest
    count: int
    standin: bool | None = None
    """The tasks/1 record's ``standin`` member (synthetic stand-in data); None where it has none."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": str(self.id), "count": self.count}
        if self.standin is not None:
            out["standin"] = self.standin
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """report.json's ``prepared`` part."""

    receipt: Digest
    prepared: Digest
    sets: Mapping[str, PreparedSet]
    damaged_targets: int

    def to_json(self) -> dict[str, Any]:
        return {"receipt": str(self.receipt), "prepared": str(self.prepared),
                "sets": {k: v.to_json() for k, v in self.sets.items()},
                "damaged_targets": self.damaged_targets}


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """report.json: every part recomputed from retained objects."""

    title: str
    action: Digest
    """The action this report is the output of (its receipt's ID cannot be inside it)."""
    inputs: Mapping[str, Digest]
    """The input receipts by name, in report order."""
    prepared: Prepared
    commitment: Digest
    subjects: Mapping[str, str]
    """The commitment's subjects: committed name -> checkpoint ID."""
    learning: Learning
    contract: Mapping[str, Any]
    """The contract verdict of every arm compared with the seed."""
    training: Training | None
    serving: Serving | None
    parameters: Parameters
    """The distance between the parameters of each compared pair of arms."""
    resources: Resources
    figures: Mapping[str, FigureData]
    """What each figure draws, by file stem."""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT,
            "title": self.title,
            "action": str(self.action),
            "inputs": {k: str(v) for k, v in self.inputs.items()},
            "prepared": self.prepared.to_json(),
            "commitment": {"id": str(self.commitment), "subjects": dict(self.subjects)},
            "learning": self.learning.to_json(),
            "contract": dict(self.contract),
            "training": self.training.to_json() if self.training is not None else None,
            "serving": self.serving.to_json() if self.serving is not None else None,
            "parameters": self.parameters.to_json(),
            "resources": self.resources.to_json(),
            "figures": {k: v.to_json() for k, v in self.figures.items()},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Computed:
    """The report and what the figures and the generations page are drawn from."""

    report: Report
    tests: FinalTest
    scored: Mapping[str, Scored]
    """Rescored answers by arm, in report order (the baseline first)."""


def compute(store: ObjectReader, inputs: Mapping[str, Digest], *, title: str, action: Digest,
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
    parameters = parameters_section(store, arms, tuple(compared))
    commitment = ev.commit.output("commitment")
    learning = Learning(baseline=BASELINE, documents=len(tests.records),
                        held_out_variants=tests.held_out, arms=arms,
                        comparisons=tuple(compared))
    report = Report(
        title=title,
        action=action,
        inputs={run.name: run.receipt for run in ev.runs()},
        prepared=prepared,
        commitment=commitment,
        subjects=store.get_record(commitment)["subjects"],
        learning=learning,
        contract=contracts,
        training=training,
        serving=serving,
        parameters=parameters,
        resources=resources,
        figures=figure_data(learning, training, serving, parameters, str(action)),
    )
    return Computed(report=report, tests=tests, scored=scored)


def prepared_section(store: ObjectReader, ev: Evidence, audit: Audit) -> Prepared:
    """Sizes of the prepared sets and the damaged-target count, from their records."""
    prepare = ev.prepare
    records = {}
    sets = {}
    for name in ("test", "dev", "train", "damaged", "replay", "retention"):
        oid = prepare.output(name)
        rec = store.get_record(oid)
        lines = jsonl(store.get_bytes(Digest.parse(rec["records"])), f"prepared {name} records")
        records[name] = lines
        sets[name] = PreparedSet(id=oid, count=len(lines), standin=rec.get("standin"))
    clean = {r["id"]: r["target"] for r in records["train"]}
    damaged = sum(1 for r in records["damaged"] if clean.get(r["id"]) != r["target"])
    audit.claim(prepare, "counts", {k: sets[k].count for k in ("test", "dev", "train")})
    audit.claim(prepare, "damaged_count", damaged)
    audit.claim(prepare, "replay_count", sets["replay"].count)
    audit.claim(prepare, "retention_count", sets["retention"].count)
    return Prepared(receipt=prepare.receipt, prepared=prepare.output("prepared"), sets=sets,
                    damaged_targets=damaged)
