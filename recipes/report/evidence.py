"""The report's evidence: its input receipts, each checked to be what its name says, and linked.

Input names say what a receipt is: ``prepare``, ``commit``, ``serve``, ``train.<arm>`` and
``evaluate.<arm>`` (``evaluate.seed`` is the baseline). A receipt must come from the recipe
its name's prefix names and must have succeeded. The receipts must also describe one
experiment: every evaluation scores the prepared test set under the commitment that fixed
its model, a trained arm's evaluation scores that arm's checkpoint, and the server serves a
committed checkpoint on the prepared dev set. Anything else is refused with a ``RecipeError``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.store.protocol import ObjectReader

BASELINE = "seed"
"""The arm every other arm is compared with (input ``evaluate.seed``)."""
SINGLE_INPUTS = ("prepare", "commit", "serve")
ARM_PREFIXES = ("train", "evaluate")


def jsonl(data: bytes, what: str) -> list[dict[str, Any]]:
    """The objects of a JSONL blob; ``what`` names it in the error."""
    out = []
    for number, line in enumerate(data.decode("utf-8").splitlines(), start=1):
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise RecipeError(f"{what} line {number} is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise RecipeError(f"{what} line {number} is not a JSON object")
        out.append(value)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One input receipt with its action and environment records."""

    name: str
    """The input name, e.g. ``train.clean-pair``."""
    recipe: str
    """The recipe name from the action's ``name@version``."""
    receipt: Digest
    record: Mapping[str, Any]
    """The receipt/1 record."""
    action: Mapping[str, Any]
    environment: Mapping[str, Any]

    @property
    def params(self) -> Mapping[str, Any]:
        return self.action["params"]

    @property
    def claims(self) -> dict[str, Any]:
        """Claimed values by name (the verifier names dropped)."""
        return {k: v["value"] for k, v in self.record["claims"].items()}

    def input(self, name: str) -> Digest | None:
        value = self.action["inputs"].get(name)
        return Digest.parse(value) if value is not None else None

    def output(self, name: str) -> Digest:
        value = self.record["outputs"].get(name)
        if value is None:
            raise RecipeError(f"input {self.name!r} ({self.receipt}) has no output {name!r}")
        return Digest.parse(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """Every input receipt, by role; arms keep the order of ``arm_order``."""

    prepare: Run
    commit: Run
    train: Mapping[str, Run]
    """Training receipts by arm."""
    evaluate: Mapping[str, Run]
    """Evaluation receipts by arm; ``BASELINE`` first."""
    serve: Run | None

    def runs(self) -> list[Run]:
        """Every run, in report order: prepare, train, commit, evaluate, serve."""
        runs = [self.prepare, *self.train.values(), self.commit, *self.evaluate.values()]
        return runs + ([self.serve] if self.serve is not None else [])


def load_run(store: ObjectReader, name: str, receipt: Digest, recipe: str) -> Run:
    """The receipt named ``name``, refused unless it is a succeeded run of ``recipe``."""
    record = store.get_record(receipt)
    if record.get("nscas") != "receipt/1":
        raise RecipeError(f"input {name!r} ({receipt}) is a {record.get('nscas')}, not a receipt/1")
    action = store.get_record(Digest.parse(record["action"]))
    made_by = action["recipe"].partition("@")[0]
    if made_by != recipe:
        raise RecipeError(f"input {name!r} ({receipt}) is a receipt of recipe {made_by!r}, "
                          f"but its name says {recipe!r}")
    if record["status"] != "succeeded":
        raise RecipeError(f"input {name!r} ({receipt}) is a failed run: "
                          f"{record.get('error', 'no error recorded')}")
    return Run(name=name, recipe=made_by, receipt=receipt, record=record, action=action,
               environment=store.get_record(Digest.parse(record["environment"])))


def load_evidence(store: ObjectReader, inputs: Mapping[str, Digest]) -> Evidence:
    """Load and cross-check every input receipt."""
    single: dict[str, Run] = {}
    arms: dict[str, dict[str, Run]] = {prefix: {} for prefix in ARM_PREFIXES}
    for name, oid in sorted(inputs.items()):
        prefix, dot, arm = name.partition(".")
        if not dot and prefix in SINGLE_INPUTS:
            single[prefix] = load_run(store, name, oid, prefix)
        elif dot and prefix in ARM_PREFIXES and arm:
            arms[prefix][arm] = load_run(store, name, oid, prefix)
        else:
            raise RecipeError(f"input {name!r} is not one of prepare, commit, serve, train.<arm>, "
                              "evaluate.<arm>")
    for needed in ("prepare", "commit"):
        if needed not in single:
            raise RecipeError(f"the report needs a {needed!r} receipt input")
    if BASELINE not in arms["evaluate"]:
        raise RecipeError("the report needs the baseline evaluation as input "
                          f"'evaluate.{BASELINE}'")
    order = arm_order(store, single["prepare"], arms["train"], arms["evaluate"])
    evidence = Evidence(
        prepare=single["prepare"], commit=single["commit"], serve=single.get("serve"),
        train={a: arms["train"][a] for a in order if a in arms["train"]},
        evaluate={a: arms["evaluate"][a] for a in order if a in arms["evaluate"]},
    )
    _check_links(store, evidence)
    return evidence


def arm_order(store: ObjectReader, prepare: Run, train: Mapping[str, Run],
              evaluate: Mapping[str, Run]) -> list[str]:
    """The baseline first, then trained arms by (world, clean before damaged, name), then the
    rest by name: the published table's order (seed, clean single, damaged single, pair)."""
    def key(arm: str) -> tuple[int, int, int, str]:
        if arm == BASELINE:
            return (0, 0, 0, arm)
        if arm not in train:
            return (2, 0, 0, arm)
        documents = documents_kind(prepare, train[arm])
        return (1, int(train[arm].params.get("world", 1)), 0 if documents == "clean" else 1, arm)

    return sorted(set(train) | set(evaluate), key=key)


def documents_kind(prepare: Run, train: Run) -> str:
    """``clean`` or ``damaged`` by which prepared document set the arm trained on, else
    ``other``."""
    documents = train.input("documents")
    if documents == prepare.output("train"):
        return "clean"
    if documents == prepare.output("damaged"):
        return "damaged"
    return "other"


def _check_links(store: ObjectReader, ev: Evidence) -> None:
    prepared = ev.prepare.output("prepared")
    if ev.commit.input("prepared") != prepared:
        raise RecipeError(f"the commit receipt {ev.commit.receipt} fixed prepared inputs "
                          f"{ev.commit.input('prepared')}, not those of the prepare receipt "
                          f"({prepared})")
    commitment = ev.commit.output("commitment")
    subjects = store.get_record(commitment)["subjects"]
    test = ev.prepare.output("test")
    for arm, run in ev.evaluate.items():
        if run.input("tasks") != test:
            raise RecipeError(f"input {run.name!r} scored task set {run.input('tasks')}, not the "
                              f"prepared test set {test}")
        if run.input("commitment") != commitment:
            raise RecipeError(f"input {run.name!r} cites commitment {run.input('commitment')}, "
                              f"not the commit receipt's {commitment}")
        model = run.input("model")
        if str(model) not in subjects.values():
            raise RecipeError(f"input {run.name!r} evaluated model {model}, which the commitment "
                              f"{commitment} does not name")
        if arm in ev.train and ev.train[arm].output("checkpoint") != model:
            raise RecipeError(f"input {run.name!r} evaluated model {model}, but train.{arm} "
                              f"produced {ev.train[arm].output('checkpoint')}")
    if ev.serve is not None:
        model = ev.serve.input("model")
        if str(model) not in subjects.values():
            raise RecipeError(f"input 'serve' served model {model}, which the commitment "
                              f"{commitment} does not name")
        if ev.serve.input("tasks") != ev.prepare.output("dev"):
            raise RecipeError(f"input 'serve' used task set {ev.serve.input('tasks')}, not the "
                              f"prepared dev set {ev.prepare.output('dev')}")


def committed_name(store: ObjectReader, ev: Evidence, model: Digest) -> str | None:
    """The name under which the commitment fixed ``model``."""
    subjects = store.get_record(ev.commit.output("commitment"))["subjects"]
    return next((name for name, oid in sorted(subjects.items()) if oid == str(model)), None)
