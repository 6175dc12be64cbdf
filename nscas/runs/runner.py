"""recipe.toml -> action -> cache or execute -> receipt (docs/format.md §6)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nscas.errors import NscasError, RecipeError, RefConflict
from nscas.objects.digests import Digest
from nscas.redacting import redact
from nscas.runs.actions import action_id, action_record, code_id, explain_miss, find_receipt
from nscas.runs.changes import CacheMiss, since
from nscas.runs.codetree import code_tree
from nscas.runs.config import (
    RunFile,
    StepConfig,
)
from nscas.runs.environment import environment
from nscas.runs.planning import (
    Planned,
    Source,
    check_tags,
    parse_step_params,
    set_tags,
    step_inputs,
)
from nscas.runs.plans import RunPlan, plan_file
from nscas.runs.recipe import NullProgress, Progress, Recipe, RecipeResult, RunContext
from nscas.runs.verdicts import Verdict, compare_outputs
from nscas.store.claims import claim_action
from nscas.store.writer import Store

if TYPE_CHECKING:
    from nscas.signing.signatures import ReceiptSigner

@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """One step of a run: its receipt and action, whether the cache answered, its outputs and
    claimed values; ``verdicts`` compare a rerun's outputs with the earlier run's."""

    step: str
    recipe: str
    receipt: Digest
    action: Digest
    cached: bool
    status: str
    outputs: Mapping[str, Digest]
    claims: Mapping[str, Any]
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)
    miss: CacheMiss | None = None
    """How the action differs from the step's previous run: why a step that was not asked to
    rerun ran, or, for a rerun compared with a run of another action, what changed."""
    error: str | None = None


ProgressFactory = Callable[[str], Progress]


class StepFailed(RecipeError):
    """A step ran and failed; its receipt (status ``failed``, with the error) is stored."""

    exit_code = 1

    def __init__(self, *, step: str, recipe: str, receipt: Digest, error: str) -> None:
        who = f"recipe {recipe!r}" if step == recipe else f"step {step!r} ({recipe})"
        super().__init__(f"{who} failed: {error} (receipt {receipt})")
        self.step = step
        self.recipe = recipe
        self.receipt = receipt
        self.error = error


class OutputRefConflict(RefConflict):
    """An output ref moved while the step ran; the step's outputs and receipt are kept."""

    exit_code = 1

    def __init__(self, conflict: RefConflict, *, step: str, receipt: Digest) -> None:
        super().__init__(conflict.name, conflict.expected, conflict.actual)
        self.message = (f"output ref {conflict.name!r} of step {step!r} moved while the step ran: "
                        f"{self.message} (the outputs are stored; receipt {receipt})")
        self.args = (self.message,)
        self.step = step
        self.receipt = receipt


@dataclass(frozen=True, slots=True, kw_only=True)
class RunNames:
    """What a receipt records of where its run came from (docs/format.md §3.9): the pipeline's
    name, the step's and the variant's (§6.10); None where not recorded. Not part of the
    action."""

    pipeline: str | None = None
    step: str | None = None
    variant: str | None = None


def run_file(store: Store, path: Path, *, rerun: bool = False,
             progress: ProgressFactory | None = None,
             on_step: Callable[[StepResult], None] | None = None,
             sets: tuple[str, ...] = (), only: tuple[str, ...] = (),
             start: str | None = None, signer: ReceiptSigner | None = None,
             name: str | None = None,
             upstream: Mapping[str, Digest] | None = None) -> list[StepResult]:
    """Run a recipe or pipeline file; step results in run order.

    ``sets`` are ``STEP.PARAM=VALUE`` overrides, written into the params as if the file said
    them; with them (or a ``name``) the run is a variant (nscas.runs.variants), with refs and
    previous runs of its own. ``only`` runs just those steps and ``start`` that step and
    every step downstream of it, the other steps' outputs taken from their previous runs (by
    pipeline, variant and step name).
    Everything that can be checked without running (the file, the overrides, recipes, params,
    inputs given by ID or ref, output ref names, the previous runs a partial run reads) is
    checked first, so bad input writes nothing. Refs are resolved once, at start; output refs
    move by compare-and-swap against their values then. A failed step raises ``StepFailed``
    after ``on_step`` has seen its result. With a ``signer``, each receipt a step writes
    (succeeded or failed; a cached one is not signed again) is signed as the step ends.
    ``upstream`` names receipts to take the outputs of steps not run here from, before their
    previous runs (how a scheduler hands one job what other jobs of its run gave).
    """
    planned = plan_file(store, path, sets=sets, only=only, start=start, name=name,
                        upstream=upstream or {})
    return run_plan(store, planned, rerun=rerun, progress=progress, on_step=on_step,
                    signer=signer)


def run_plan(store: Store, planned: RunPlan, *, rerun: bool = False,
             progress: ProgressFactory | None = None,
             on_step: Callable[[StepResult], None] | None = None,
             signer: ReceiptSigner | None = None) -> list[StepResult]:
    """Run a checked plan's steps one after another (``run_file`` once it has checked)."""
    sources = dict(planned.sources)
    results: list[StepResult] = []
    for item in planned.steps:
        result = run_planned_step(store, planned, item, sources, rerun=rerun,
                                  progress=progress, signer=signer)
        results.append(result)
        sources[item.step.name] = Source(receipt=result.receipt, outputs=result.outputs)
        if on_step is not None:
            on_step(result)
        if result.status != "succeeded":
            raise StepFailed(step=result.step, recipe=result.recipe, receipt=result.receipt,
                             error=result.error or "unknown error")
    return results


def run_planned_step(store: Store, planned: RunPlan, item: Planned,
                     sources: Mapping[str, Source], *, rerun: bool = False,
                     progress: ProgressFactory | None = None,
                     signer: ReceiptSigner | None = None) -> StepResult:
    """Run one step of a checked plan, its ``step.<name>`` inputs taken from ``sources``."""
    where = planned.where
    inputs = {**item.inputs, **step_inputs(store, item, sources, where)}
    result = run_step(store, item.recipe, item.step, inputs, where=where, rerun=rerun,
                      params=item.params,
                      progress=progress(item.step.name) if progress else NullProgress(),
                      expected_refs=item.expected_refs, refs=item.refs,
                      names=_names(planned.spec, item.step, planned.runs.variant),
                      previous_run=planned.runs.latest(item.step.name) if rerun else None,
                      last_run=partial(planned.runs.latest, item.step.name, original=True))
    if signer is not None and not result.cached:
        signer.sign(store, result.receipt)
    return result


def cached_receipt(store: Store, item: Planned, sources: Mapping[str, Source],
                   where: str, *, code: Digest | None = None) -> Digest | None:
    """The succeeded receipt of the action this step would run now, if there is one; found
    without writing anything (a scheduler answers such a step without starting a job).
    ``code``: the recipe's ``code_id``, where the caller has it already."""
    inputs = {**item.inputs, **step_inputs(store, item, sources, where)}
    return find_receipt(store, action_id(item.recipe, code or code_id(item.recipe), inputs,
                                         item.params))


def _names(spec: RunFile, step: StepConfig, variant: str | None) -> RunNames:
    """What the step's receipt records of the run's pipeline, step and variant."""
    pipeline, record_step = spec.receipt_names()
    return RunNames(pipeline=pipeline, step=step.name if record_step else None, variant=variant)


def run_step(store: Store, recipe: Recipe, step: StepConfig, inputs: Mapping[str, Digest], *,
             where: str, rerun: bool = False, params: Any = None,
             progress: Progress | None = None,
             expected_refs: Mapping[str, Digest | None] | None = None,
             refs: tuple[tuple[str, str], ...] | None = None,
             names: RunNames | None = None,
             previous_run: Digest | None = None,
             last_run: Callable[[], Digest | None] | None = None) -> StepResult:
    """Run one checked step: reuse the receipt of its action, or execute it (``rerun``: always).

    ``params`` is the step's parsed params (as ``run_file`` checked them); when not given,
    ``step.params`` is parsed here. ``refs`` are the (output or ``receipt``, ref) pairs to move
    (default: the step's declared outputs); ``names`` what the receipt records of the run's
    pipeline, step and variant. A rerun compares its outputs with ``previous_run`` (the
    step's previous run by those names), else with the cached receipt of its action. A step
    that misses the cache says how its action differs from the run ``last_run`` gives (asked
    only then: finding it may read every receipt), else from the one ``explain_miss`` finds.
    """
    if params is None:
        params = parse_step_params(recipe, step, where, "")
    if refs is None:
        refs = tuple(step.outputs.items())
    if expected_refs is None:
        expected_refs = {ref: store.ref_get(ref) for _, ref in refs}
    if set_tags(expected_refs):  # before any write: the action's ID, computed
        action = action_id(recipe, code_id(recipe), inputs, params)
        check_tags(store, refs, expected_refs, find_receipt(store, action), where, "")
    code = code_tree(store, recipe)
    action = store.put_record(action_record(recipe, code, inputs, params))
    with claim_action(store, action):  # two runs of one action at once: the later one waits
        return _run_claimed(store, recipe, step, inputs, action, where=where, rerun=rerun,
                            params=params, progress=progress, expected_refs=expected_refs,
                            refs=refs, names=names, previous_run=previous_run,
                            last_run=last_run)


def _run_claimed(store: Store, recipe: Recipe, step: StepConfig, inputs: Mapping[str, Digest],
                 action: Digest, *, where: str, rerun: bool, params: Any,
                 progress: Progress | None, expected_refs: Mapping[str, Digest | None],
                 refs: tuple[tuple[str, str], ...], names: RunNames | None,
                 previous_run: Digest | None,
                 last_run: Callable[[], Digest | None] | None) -> StepResult:
    """``run_step`` once this process holds the claim on ``action``: the cache is asked only
    now, so a run that waited for another run of the action reuses its receipt."""
    previous = find_receipt(store, action)
    if previous is not None and not rerun:
        rec = store.get_record(previous)
        outputs = {k: Digest.parse(v) for k, v in rec["outputs"].items()}
        _set_refs(store, step, refs, outputs, expected_refs, previous)
        return StepResult(step=step.name, recipe=recipe.name, receipt=previous, action=action,
                          cached=True, status="succeeded", outputs=outputs,
                          claims=_claim_values(rec["claims"]))
    compared = previous_run if rerun and previous_run is not None else previous
    if previous is None and not rerun:
        last = last_run() if last_run is not None else None
        miss: CacheMiss | None = (since(store, last, store.get_record(action)) if last is not None
                                  else explain_miss(store, action, refs, expected_refs))
    elif (compared is not None
          and store.get_record(compared)["action"] != str(action)):  # an upstream run changed
        miss = since(store, compared, store.get_record(action))
    else:
        miss = None
    receipt, result, error = _execute(store, recipe, step.name, params, inputs, action,
                                      progress or NullProgress(), rerun, names or RunNames())
    if result is None:
        return StepResult(step=step.name, recipe=recipe.name, receipt=receipt, action=action,
                          cached=False, status="failed", outputs={}, claims={}, miss=miss,
                          error=error)
    verdicts: dict[str, Verdict] = {}
    if rerun and compared is not None:
        before = {k: Digest.parse(v) for k, v in store.get_record(compared)["outputs"].items()}
        verdicts = compare_outputs(store, before, dict(result.outputs),
                                   measurements=recipe.measurements)
    _set_refs(store, step, refs, dict(result.outputs), expected_refs, receipt)
    return StepResult(step=step.name, recipe=recipe.name, receipt=receipt, action=action,
                      cached=False, status="succeeded", outputs=dict(result.outputs),
                      claims={k: c.value for k, c in result.claims.items()}, verdicts=verdicts,
                      miss=miss)


def _execute(store: Store, recipe: Recipe, step: str, params: Any, inputs: Mapping[str, Digest],
             action: Digest, progress: Progress, rerun: bool,
             names: RunNames) -> tuple[Digest, RecipeResult | None, str | None]:
    started = _now()
    area = store.work_area(action, action_claimed=True)  # run_step holds the action's claim
    ctx = RunContext(store=store, inputs=dict(inputs), params=params, workdir=area.scratch,
                     progress=progress, store_path=store.root, rerun=rerun, action=action,
                     work_area=area.persistent,
                     shared_tree=lambda tree: store.shared_tree(area, tree),
                     unshare_tree=lambda tree: store.unshare_tree(area, tree))
    result: RecipeResult | None = None
    error: str | None = None
    succeeded = False
    try:
        try:
            result = recipe.run(ctx)
            unknown = sorted(set(result.outputs) - set(recipe.outputs))
            if unknown:
                raise RecipeError(f"recipe {recipe.name!r} produced undeclared output(s): "
                                  f"{', '.join(unknown)}")
        except NscasError as exc:
            error = exc.message
        except BaseException as exc:  # recorded as a failed receipt, then raised
            message = _crash_message(exc)
            receipt = _receipt(store, action, started, None, message, names)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            raise StepFailed(step=step, recipe=recipe.name, receipt=receipt, error=message) from exc
        finally:
            progress.finish()
        if error is not None:
            return _receipt(store, action, started, None, error, names), None, error
        receipt = _receipt(store, action, started, result, None, names)
        succeeded = True
        return receipt, result, None
    finally:
        # A failed or interrupted run keeps its work area for the next run of the action to
        # resume from; a process killed before this line leaves it to gc (docs/format.md §5.8).
        store.release_work_area(area, keep=not succeeded)


def _receipt(store: Store, action: Digest, started: str, result: RecipeResult | None,
             error: str | None, names: RunNames) -> Digest:
    record: dict[str, Any] = {
        "nscas": "receipt/1", "action": str(action), "environment": str(store.put_record(environment())),
        "outputs": {k: str(v) for k, v in (result.outputs if result else {}).items()},
        "journals": [str(j) for j in (result.journals if result else ())],
        "claims": {k: {"value": c.value, "verifier": c.verifier} for k, c in (result.claims if result else {}).items()},
        "started": started, "finished": _now(), "status": "succeeded" if result else "failed",
    }
    if error is not None:
        record["error"] = error
    if names.pipeline is not None:  # where the run came from; not part of the action
        record["pipeline"] = names.pipeline
    if names.step is not None:
        record["step"] = names.step
    if names.variant is not None:
        record["variant"] = names.variant
    return store.put_record(record)


def _set_refs(store: Store, step: StepConfig, refs: tuple[tuple[str, str], ...],
              outputs: Mapping[str, Digest], expected: Mapping[str, Digest | None],
              receipt: Digest) -> None:
    targets = {**outputs, "receipt": receipt}
    for output, ref in refs:
        if output in targets:
            try:
                store.ref_set(ref, targets[output], expect=expected[ref], message=f"run {receipt}")
            except RefConflict as exc:
                raise OutputRefConflict(exc, step=step.name, receipt=receipt) from None


def _crash_message(exc: BaseException) -> str:
    """``Type: message (at file:line)``: where a recipe crashed, for the failed receipt."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return redact(f"{type(exc).__name__}: {exc}{where}")  # a URL's password in it never lands


def _claim_values(claims: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v["value"] for k, v in claims.items()}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


__all__ = [
    "OutputRefConflict",
    "RunNames",
    "StepFailed",
    "StepResult",
    "cached_receipt",
    "run_file",
    "run_plan",
    "run_planned_step",
    "run_step",
]
