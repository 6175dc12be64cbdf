"""Recipe ``commit``: fix the candidates (one checkpoint per arm) before any test-set scoring."""

from __future__ import annotations

from dataclasses import dataclass

from nscas.errors import RecipeError
from nscas.objects.digests import Digest
from nscas.runs.recipe import Claim, InputSpec, Recipe, RecipeResult, RunContext
from nscas.store.protocol import ObjectReader

PURPOSE = "candidates fixed before final-test scoring"


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitParams:
    experiment: str = "cooperative-learning"
    """Name of the experiment; earlier commitments of it over the same prepared inputs are chained."""


def provenance(store: ObjectReader, roots: list[Digest]) -> set[Digest]:
    """Everything a candidate came from: its links, the receipts that produced any of those, and
    their actions' inputs, transitively."""
    seen: set[Digest] = set()
    frontier = list(roots)
    while frontier:
        oid = frontier.pop()
        if oid in seen:
            continue
        seen.add(oid)
        if store.info(oid).kind is not None:
            frontier.extend(link.child for link in store.links_from(oid))
        for link in store.links_to(oid):
            if link.path.startswith("$.outputs."):
                frontier.append(link.parent)
    return seen


def test_evaluations(store: ObjectReader, objects: set[Digest]) -> list[Digest]:
    """Evaluation receipts of the ``test`` role among ``objects``."""
    found = []
    for oid in sorted(objects):
        if store.info(oid).kind != "receipt/1":
            continue
        action = store.get_record(Digest.parse(store.get_record(oid)["action"]))
        if not action["recipe"].startswith("evaluate@") or "tasks" not in action["inputs"]:
            continue
        if store.get_record(Digest.parse(action["inputs"]["tasks"])).get("role") == "test":
            found.append(oid)
    return found


def previous_commitment(store: ObjectReader, prepared: Digest, experiment: str) -> Digest | None:
    """The latest earlier candidate commitment of this experiment over the same prepared inputs."""
    latest = None
    for link in store.links_to(prepared):
        if link.path != "$.subjects.prepared":
            continue
        rec = store.get_record(link.parent)
        if rec.get("nscas") == "commitment/1" and rec.get("purpose") == PURPOSE \
                and rec.get("experiment") == experiment:
            info = store.info(link.parent)
            if latest is None or info.created > latest[0]:
                latest = (info.created, link.parent)
    return latest[1] if latest else None


def run(ctx: RunContext) -> RecipeResult:
    store = ctx.store
    arms = {name: oid for name, oid in ctx.inputs.items() if name != "prepared"}
    if not arms:
        raise RecipeError("commit needs at least one candidate checkpoint (an input named after its arm)")
    for name, oid in sorted(arms.items()):
        tainted = test_evaluations(store, provenance(store, [oid]))
        if tainted:
            raise RecipeError(f"candidate {name!r} ({oid}) already depends on a test-set evaluation "
                              f"({tainted[0]}); candidates must be fixed before final-test scoring")
    prepared = ctx.inputs["prepared"]
    previous = previous_commitment(store, prepared, ctx.params.experiment)
    subjects = {"prepared": str(prepared), **{k: str(v) for k, v in sorted(arms.items())}}
    if previous is not None and store.get_record(previous)["subjects"] == subjects:
        # The latest commitment already fixes exactly these candidates (a rerun): it is the
        # commitment, rather than a new one that names it as previous.
        previous = store.get_record(previous)["previous"]
        previous = Digest.parse(previous) if previous else None
    commitment = store.put_record({
        "nscas": "commitment/1", "purpose": PURPOSE, "experiment": ctx.params.experiment,
        "subjects": subjects,
        "previous": str(previous) if previous else None,
    })
    return RecipeResult(outputs={"commitment": commitment}, claims={
        "candidates": Claim(value=sorted(arms), verifier="ordering"),
    })


RECIPE = Recipe(
    name="commit",
    version="1",
    params=CommitParams,
    inputs={"prepared": InputSpec(kind="commitment/1", doc="the prepare recipe's commitment")},
    outputs=("commitment",),
    run=run,
    extra_inputs=True,
    extra_kind="checkpoint/1",
    doc="Commit one checkpoint per arm (inputs named after the arms) before final-test scoring.",
)
