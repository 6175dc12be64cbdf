"""The input receipts of a ``report`` run (docs/experiment.md §6), by role, and the rules that link them.

Input names say what each receipt is: ``prepare``, ``commit``, ``serve``, ``train.<arm>`` and
``evaluate.<arm>``; ``evaluate.seed`` is the baseline. A report describes one experiment, so:
each input is a succeeded run of the recipe its name's prefix names; the commit fixed the
prepared inputs of the prepare run; every evaluation scored the prepared test set under that
commitment, on a committed model; a trained arm's evaluation scored that arm's checkpoint;
the server served a committed model on the prepared dev set. Broken rules are findings
(``links``), not exceptions: the numbers are still recomputed.

Arms are in report order: the baseline, then trained arms by (world, clean before damaged,
name), then the rest by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..core.errors import InvalidArgument
from ..core.runs import Run
from ..records.closure import Objects

BASELINE = "seed"
"""The arm every other arm is compared with (input ``evaluate.seed``)."""
SINGLE = ("prepare", "commit", "serve")
ARMED = ("train", "evaluate")


@dataclass(frozen=True, slots=True, kw_only=True)
class Inputs:
    """Every input receipt by role; arms in report order."""

    prepare: Run
    commit: Run
    train: dict[str, Run]
    evaluate: dict[str, Run]
    """The baseline first."""
    serve: Run | None

    def runs(self) -> list[Run]:
        """prepare, train, commit, evaluate, serve: the order of report.json's ``inputs``."""
        runs = [self.prepare, *self.train.values(), self.commit, *self.evaluate.values()]
        return runs + ([self.serve] if self.serve is not None else [])


def _run(objects: Objects, name: str, oid: str) -> Run:
    receipt = objects.record_of(oid, "receipt/1")
    action = objects.record_of(receipt["action"], "action/1")
    return Run(name=name, recipe=action["recipe"].partition("@")[0], id=oid,
                    receipt=receipt, action=action)


def load_inputs(objects: Objects, inputs: Mapping[str, str]) -> tuple[Inputs, list[str]]:
    """The report's inputs by role, and every broken rule found among them. Raises
    ``InvalidArgument`` only for a report whose required inputs are absent or misnamed."""
    single: dict[str, Run] = {}
    armed: dict[str, dict[str, Run]] = {prefix: {} for prefix in ARMED}
    for name, oid in sorted(inputs.items()):
        prefix, dot, arm = name.partition(".")
        if not dot and prefix in SINGLE:
            single[prefix] = _run(objects, name, oid)
        elif dot and prefix in ARMED and arm:
            armed[prefix][arm] = _run(objects, name, oid)
        else:
            raise InvalidArgument("report input", f"{name!r} is not prepare, commit, serve, "
                                  "train.<arm> or evaluate.<arm>")
    for needed in ("prepare", "commit"):
        if needed not in single:
            raise InvalidArgument("report inputs", f"no {needed!r} receipt")
    if BASELINE not in armed["evaluate"]:
        raise InvalidArgument("report inputs", f"no baseline evaluation 'evaluate.{BASELINE}'")
    prepare = single["prepare"]
    order = arm_order(prepare, armed["train"], armed["evaluate"])
    ins = Inputs(prepare=prepare, commit=single["commit"], serve=single.get("serve"),
                 train={a: armed["train"][a] for a in order if a in armed["train"]},
                 evaluate={a: armed["evaluate"][a] for a in order if a in armed["evaluate"]})
    return ins, link_problems(objects, ins)


def documents_kind(prepare: Run, train: Run) -> str:
    """``clean`` or ``damaged`` by the prepared set the arm trained on, else ``other``."""
    documents = train.inputs.get("documents")
    if documents is not None and documents == prepare.outputs.get("train"):
        return "clean"
    if documents is not None and documents == prepare.outputs.get("damaged"):
        return "damaged"
    return "other"


def world_of(run: Run) -> int:
    return int(run.params.get("world", 1))


def arm_order(prepare: Run, train: Mapping[str, Run],
              evaluate: Mapping[str, Run]) -> list[str]:
    def key(arm: str) -> tuple[int, int, int, str]:
        if arm == BASELINE:
            return (0, 0, 0, arm)
        if arm not in train:
            return (2, 0, 0, arm)
        damaged = documents_kind(prepare, train[arm]) != "clean"
        return (1, world_of(train[arm]), int(damaged), arm)

    return sorted(set(train) | set(evaluate), key=key)


def commitment_subjects(objects: Objects, ins: Inputs) -> dict[str, str]:
    record = objects.record_of(ins.commit.outputs["commitment"], "commitment/1")
    subjects: dict[str, str] = record["subjects"]  # record_of checked the commitment/1 schema
    return subjects


def link_problems(objects: Objects, ins: Inputs) -> list[str]:
    """Every way the inputs fail to describe one experiment (see the module docstring)."""
    problems = []
    for run in ins.runs():
        expected = run.name.partition(".")[0]
        if run.recipe != expected:
            problems.append(f"{run.name} is a run of recipe {run.recipe!r}")
        if run.receipt.get("status") != "succeeded":
            problems.append(f"{run.name} did not succeed")
    prepared = ins.prepare.outputs.get("prepared")
    if ins.commit.inputs.get("prepared") != prepared:
        problems.append("the commit fixed other prepared inputs than the prepare run made")
    subjects = commitment_subjects(objects, ins)
    committed = set(subjects.values())
    commitment = ins.commit.outputs["commitment"]
    for arm, run in ins.evaluate.items():
        if run.inputs.get("tasks") != ins.prepare.outputs.get("test"):
            problems.append(f"{run.name} did not score the prepared test set")
        if run.inputs.get("commitment") != commitment:
            problems.append(f"{run.name} cites another commitment")
        model = run.inputs.get("model")
        if model not in committed:
            problems.append(f"{run.name} scored model {model}, which the commitment does not "
                            "name")
        if arm in ins.train and ins.train[arm].outputs.get("checkpoint") != model:
            problems.append(f"{run.name} scored another model than train.{arm} produced")
    if ins.serve is not None:
        if ins.serve.inputs.get("model") not in committed:
            problems.append("serve served a model the commitment does not name")
        if ins.serve.inputs.get("tasks") != ins.prepare.outputs.get("dev"):
            problems.append("serve did not use the prepared dev set")
    return problems


# --- resources ---------------------------------------------------------------------------

CPU_NOTE = ("cpu runs count one CPU 'device' per rank, replica or process, not per core; "
            "their device seconds are totalled apart from GPU device seconds")
COST_NOTE = ("estimate only: price_per_host_hour x hosts x wall hours of the runs listed; it "
             "excludes setup and idle time outside the runs, storage, transfer and taxes; not "
             "an invoice")
NO_COST_NOTE = ("no price per host-hour given (param price_per_host_hour), so no cost "
                "estimate")
RESOURCE_NOTES = (
    "wall seconds run from each receipt's started to its finished time, setup included",
    "allocated device seconds = wall seconds x devices used (world for train, replicas "
    "for serve, one otherwise)",
    CPU_NOTE,
)
"""The fixed prose of report.json's ``resources``, regenerated exactly."""

def _devices(run: Run) -> tuple[str, int]:
    device = str(run.params.get("device", "cpu"))
    if run.recipe == "train":
        return device, world_of(run)
    if run.recipe == "serve":
        return device, int(run.params.get("replicas", 2))
    if run.recipe == "evaluate":
        return device, 1
    return "cpu", 1


def _wall_seconds(run: Run) -> float:
    try:
        started = datetime.fromisoformat(run.receipt["started"])
        finished = datetime.fromisoformat(run.receipt["finished"])
    except (TypeError, ValueError) as exc:
        raise InvalidArgument(f"{run.name} receipt times", str(exc)) from None
    return (finished - started).total_seconds()


def run_resources(objects: Objects, run: Run) -> dict[str, Any]:
    """Where one input ran, for how long, on how many devices (from its receipt and
    environment records)."""
    device, used = _devices(run)
    env = objects.record_of(run.receipt["environment"], "environment/1")
    kinds = ("cuda",) if device == "cuda" else ("cpu",)
    names = [d.get("name") for d in env.get("devices", []) if d.get("type") in kinds]
    wall = _wall_seconds(run)
    hosts = int(run.params.get("nnodes", 1)) if run.recipe == "train" else 1
    torch = env.get("torch")
    return {
        "input": run.name, "recipe": run.recipe, "receipt": run.id, "host": env.get("host"),
        "hosts": hosts, "device_type": device, "devices_used": used,
        "device_names": names[:used] if device == "cuda" else names[:1],
        "python": env.get("python"),
        "torch": torch.get("version") if isinstance(torch, dict) else None,
        "platform": env.get("platform"), "started": run.receipt["started"],
        "finished": run.receipt["finished"], "wall_seconds": wall,
        "allocated_device_seconds": wall * used, "host_hours": hosts * wall / 3600,
    }


def resources(objects: Objects, ins: Inputs, price_per_host_hour: float) -> dict[str, Any]:
    """report.json's ``resources``, its fixed prose included."""
    runs = [run_resources(objects, run) for run in ins.runs()]
    by_type: dict[str, float] = {}
    for r in runs:
        by_type[r["device_type"]] = by_type.get(r["device_type"], 0.0) \
            + r["allocated_device_seconds"]
    host_hours = sum(r["host_hours"] for r in runs)
    priced = price_per_host_hour > 0
    return {
        "runs": runs,
        "totals": {"wall_seconds": sum(r["wall_seconds"] for r in runs),
                   "allocated_device_seconds": by_type, "host_hours": host_hours},
        "cost_estimate": {"price_per_host_hour": price_per_host_hour if priced else None,
                          "host_hours": host_hours,
                          "estimate": price_per_host_hour * host_hours if priced else None,
                          "note": COST_NOTE if priced else NO_COST_NOTE},
        "notes": list(RESOURCE_NOTES),
    }
