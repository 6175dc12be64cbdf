"""``nscas run``: run a recipe or pipeline file, reusing receipts of actions already run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nscas.cli import completion, render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.errors import InvalidInput, NscasError

if TYPE_CHECKING:
    from nscas.runs.changes import CacheMiss
    from nscas.runs.runner import StepResult
    from nscas.runs.verdicts import Verdict

app = command_app()


@app.command()
def run(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(
        metavar="FILE", show_default=False,
        help="A recipe file (recipe = ...) or a pipeline file ([[step]] tables).")],
    rerun: Annotated[bool, typer.Option(
        "--rerun", help="Run again even if a receipt exists, and compare the outputs with the "
                        "step's previous run.")]
        = False,
    sets: Annotated[list[str] | None, typer.Option(
        "--set", metavar="STEP.PARAM=VALUE", show_default=False,
        autocompletion=completion.step_params,
        help="Set a param as if the file said it (repeatable); VALUE is TOML (3e-5, \"cuda\", "
             "[1, 2]) or else a bare string. In a recipe file PARAM=VALUE is enough.")] = None,
    only: Annotated[list[str] | None, typer.Option(
        "--only", metavar="STEP", show_default=False, autocompletion=completion.steps,
        help="Run only this step (repeatable); the others' outputs come from their previous "
             "runs in this pipeline.")] = None,
    start: Annotated[str | None, typer.Option(
        "--from", metavar="STEP", show_default=False, autocompletion=completion.steps,
        help="Run this step and every step downstream of it; earlier steps' outputs come from "
             "their previous runs in this pipeline.")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", metavar="NAME", show_default=False,
        help="Name the variant this run is (default, with --set: a name made of the "
             "overrides, e.g. train.lr-3e-4); its refs end in /variants/NAME.")] = None,
    wide: Annotated[bool, typer.Option(
        "--wide", help="Print every table cell whole (full IDs), however wide the terminal.")]
        = False,
    sign_key: Annotated[Path | None, typer.Option(
        "--sign-key", metavar="KEY", show_default=False, dir_okay=False,
        help="Sign each receipt this run writes with this private key file (mode 0600, from "
             "'nscas key new'); default: $NSCAS_SIGNING_KEY, if set.")] = None,
    jobs: Annotated[int | None, typer.Option(
        "--jobs", "-j", metavar="N", min=1, max=1024, show_default=False,
        help="Run up to N ready steps of a pipeline at once, each in its own process with the "
             "CPU cores and GPUs its recipe declares (default: the file's jobs, else as many "
             "as this machine has CPU cores or GPUs); 1: one step at a time, in this "
             "process.")] = None,
    gpu_share: Annotated[int, typer.Option(
        "--gpu-share", metavar="K", min=1, max=64,
        help="With --jobs: let up to K steps use one GPU at once (their memory estimates "
             "permitting).")] = 1,
    keep_going: Annotated[bool, typer.Option(
        "--keep-going", help="With --jobs: after a step fails, finish the steps that do not "
                             "depend on it (default: stop every job).")] = False,
    executor: Annotated[str | None, typer.Option(
        "--executor", metavar="local|ray", show_default=False,
        help="Where a pipeline's steps run: local (processes on this machine) or ray (tasks "
             "on a Ray cluster; default: the file's [executor], else local).")] = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", metavar="ADDRESS", show_default=False,
        help="With --executor ray: the cluster's address (default: the file's [executor] "
             "address, else $RAY_ADDRESS, else a cluster started on this host).")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run a recipe or pipeline file and print each step's receipt, outputs and claims.

    A step whose action already has a receipt is not run again (it is shown as cached, one
    line per step in a pipeline); one that runs says what changed since the step's last run
    (code files, params, inputs); --rerun runs it anyway and reports per output, against the
    step's previous run: identical, within-tolerance (with the distance), reproduced (timings
    differ) for a measurement, or different. A failed step exits 1, naming its receipt; bad
    input exits 2 and writes nothing. With a signing key (--sign-key or $NSCAS_SIGNING_KEY)
    each receipt written is signed as its step ends (a signature/1 record). With --set (or
    --name) the run is a variant: its refs are its own (<refs>/variants/NAME/..., and
    REF/variants/NAME for each output ref), and --only/--from read the variant's earlier runs.
    The last line counts the steps cached, ran and failed, and gives a rerun's verdict.
    A pipeline's ready steps run at once (docs/pipelines.md), up to --jobs N (or jobs = N in
    the file; by default as many as the machine has CPU cores or GPUs), each step within the
    resources its recipe declares: a live table on a terminal, each job's log under the
    store's logs/, finished steps reported in run order; with an explicit --jobs (or jobs),
    --json prints one JSON event a line. The actions and outputs are those of a run one step
    at a time, which --jobs 1 is (in this process).
    With --executor ray each step is a task on a Ray cluster, against the same store.

    Example: nscas run examples/cooperative-learning/experiment.toml --set init.seed=1 --from init
    """
    from nscas.cli.progress import progress_for
    from nscas.runs.config import EXECUTORS
    from nscas.runs.plans import load_plan_file, select_steps, variant_of
    from nscas.runs.resources import default_jobs
    from nscas.runs.runner import StepFailed, run_file
    from nscas.runs.variants import variant_prefix
    from nscas.signing.signatures import KeySigner, configured_key

    set_texts, only_steps = tuple(sets or ()), tuple(only or ())
    spec = load_plan_file(file, set_texts)  # checked before the store is opened
    chosen = select_steps(spec, only_steps, start)
    variant = variant_of(file, set_texts, name)
    key = configured_key(sign_key)  # a bad or exposed key file: one line, nothing run
    signer = KeySigner(key) if key is not None else None
    pipeline = spec.pipeline
    results: list[StepResult] = []
    announced: list[str] = []

    def on_step(result: StepResult) -> None:
        results.append(result)
        if as_json:
            return
        if variant is not None and not announced:  # once the run is checked and under way
            where = (f"{variant_prefix(spec.refs, variant.name)}/" if spec.refs is not None
                     else f"REF/variants/{variant.name} for each output ref REF")
            announced.append(variant.name)
            render.note(f"variant {variant.name}: refs under {where}")
        render_step(result, pipeline=pipeline, wide=wide)

    kind = executor or (spec.executor.kind if spec.executor else "local")
    if kind not in EXECUTORS:
        raise InvalidInput(f"--executor must be one of {', '.join(EXECUTORS)}, got {kind!r}")
    if kind == "ray" and not spec.pipeline:
        raise InvalidInput(f"{file}: --executor ray runs a pipeline file's steps; this is a "
                           "recipe file")
    if kind == "ray":
        from nscas.cli.run_jobs import run_on_ray

        address = ray_address or (spec.executor.address if spec.executor else None)
        with open_cli_store(ctx) as store:
            run_on_ray(store, file, address=address, jobs=jobs or spec.jobs,
                       gpu_share=gpu_share, keep_going=keep_going, rerun=rerun,
                       sets=set_texts, only=only_steps, start=start, name=name,
                       variant=variant.name if variant else None, sign_key=sign_key,
                       wide=wide, as_json=as_json, events=(jobs or spec.jobs) is not None,
                       steps=len(chosen), on_step=on_step)
        return
    asked = jobs or spec.jobs
    at_once = asked or (default_jobs() if spec.pipeline and len(chosen) > 1 else 1)
    if spec.pipeline and at_once > 1:
        from nscas.cli.run_jobs import run_with_jobs

        with open_cli_store(ctx) as store:
            run_with_jobs(store, file, jobs=at_once, gpu_share=gpu_share,
                          keep_going=keep_going, rerun=rerun, sets=set_texts, only=only_steps,
                          start=start, name=name, variant=variant.name if variant else None,
                          sign_key=sign_key, wide=wide, as_json=as_json,
                          events=asked is not None, steps=len(chosen), on_step=on_step)
        return
    with open_cli_store(ctx) as store:
        try:
            run_file(store, file, rerun=rerun, progress=progress_for, on_step=on_step,
                     sets=set_texts, only=only_steps, start=start, signer=signer, name=name)
        except NscasError as exc:
            # A recipe that crashed ends the run before its step is reported: counted failed.
            crashed = (isinstance(exc, StepFailed)
                       and not any(r.step == exc.step for r in results))
            if results or crashed:  # what did run is still reported; the error goes to stderr
                _finish(results, variant.name if variant else None, pipeline=pipeline,
                        steps=len(chosen), rerun=rerun, as_json=as_json, crashed=crashed)
            raise
    _finish(results, variant.name if variant else None, pipeline=pipeline, steps=len(chosen),
            rerun=rerun, as_json=as_json)


def _finish(results: list[StepResult], variant: str | None, *, pipeline: bool, steps: int,
            rerun: bool, as_json: bool, crashed: bool = False) -> None:
    if as_json:
        if results:
            render.json_out(results_json(results, pipeline=pipeline, variant=variant))
    else:
        render.note(summary_line(results, steps=steps, rerun=rerun, crashed=crashed))


def summary_line(results: list[StepResult], *, steps: int, rerun: bool,
                 crashed: bool = False) -> str:
    """``3 steps: 1 cached, 1 ran, 1 failed, 0 not run`` (the last only when some were not),
    then for a rerun ``; rerun verdict: reproduced (4 identical, 1 within-tolerance)``, or
    ``different (1 of 5 outputs: b.seen)``, or ``not compared`` where no step had an earlier
    run to compare with. ``crashed``: one more step failed, one whose recipe crashed (it
    raised instead of being reported)."""
    failed = sum(r.status != "succeeded" for r in results)
    cached = sum(r.cached for r in results)
    counts = [f"{cached} cached", f"{len(results) - cached - failed} ran",
              f"{failed + crashed} failed"]
    if len(results) + crashed < steps:
        counts.append(f"{steps - len(results) - crashed} not run")
    failed += crashed
    line = f"{steps} step{'' if steps == 1 else 's'}: {', '.join(counts)}"
    if not rerun:
        return line
    verdicts = [(f"{r.step}.{name}", v.status) for r in results for name, v in r.verdicts.items()]
    different = [name for name, status in verdicts if status == "different"]
    if different:
        verdict = (f"different ({len(different)} of {len(verdicts)} outputs: "
                   f"{', '.join(different)})")
    elif failed:
        verdict = "not reproduced (a step failed)"
    elif not verdicts:
        verdict = "not compared (no earlier run of these steps)"
    else:
        tally = {status: sum(s == status for _, s in verdicts) for _, status in verdicts}
        verdict = "reproduced (" + ", ".join(f"{n} {status}" for status, n in tally.items()) + ")"
    return f"{line}; rerun verdict: {verdict}"


def results_json(results: list[StepResult], *, pipeline: bool,
                 variant: str | None = None) -> Any:
    """One object for a recipe file; a list in run order, each with ``step``, for a pipeline;
    each with ``variant`` in a variant's run."""
    items = [step_json(r, pipeline=pipeline, variant=variant) for r in results]
    return items if pipeline else items[0]


def step_json(result: StepResult, *, pipeline: bool,
              variant: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"step": result.step} if pipeline else {}
    if variant is not None:
        out["variant"] = variant
    out.update({
        "receipt": str(result.receipt), "action": str(result.action), "cached": result.cached,
        "outputs": {k: str(v) for k, v in result.outputs.items()}, "claims": dict(result.claims),
    })
    if result.verdicts:
        out["verdicts"] = {k: v.to_json() for k, v in result.verdicts.items()}
    if result.miss is not None and result.miss.previous is not None:
        out["miss"] = miss_json(result.miss)
    if result.status != "succeeded":
        out["status"] = result.status
        out["error"] = result.error
    return out


def miss_json(miss: CacheMiss) -> dict[str, Any]:
    """What changed since the step's last run (``previous``, its receipt)."""
    out: dict[str, Any] = {"previous": str(miss.previous)}
    if miss.recipe is not None:
        out["recipe"] = list(miss.recipe)
    out.update({"inputs": list(miss.inputs), "params": list(miss.params),
                "changes": [c.to_json() for c in miss.changes], "code": {
                    "changed": list(miss.code.changed), "added": list(miss.code.added),
                    "removed": list(miss.code.removed)}})
    return out


def miss_rows(miss: CacheMiss) -> list[list[str]]:
    """``since receipt ID``, then one ``changed`` row per thing that differs, each input and
    param as ``NAME: OLD -> NEW``."""
    rows = [["since", "receipt", str(miss.previous)]]
    if miss.recipe is not None:
        rows.append(["changed", "recipe", " -> ".join(miss.recipe)])
    rows += [["changed", c.what, render.change(c.name, c.old, c.new)] for c in miss.changes]
    for how, files in (("changed", miss.code.changed), ("added", miss.code.added),
                       ("removed", miss.code.removed)):
        rows += [["changed", "code", f"{path} ({how})"] for path in files]
    return rows


def verdict_text(verdict: Verdict) -> str:
    """``identical``, ``within-tolerance (relative L2 3.1e-07, max |Δ| 2.4e-08)``,
    ``reproduced (timings differ)``, ``different``."""
    text = verdict.status
    details = []
    if verdict.relative_l2 is not None:
        details.append(f"relative L2 {verdict.relative_l2:.3g}, max |Δ| {verdict.max_abs_diff:.3g}")
    if verdict.note:
        details.append(verdict.note)
    return f"{text} ({'; '.join(details)})" if details else text


def render_step(result: StepResult, *, pipeline: bool, wide: bool = False) -> None:
    if pipeline and result.cached:  # one line: `nscas show` or --json give the rest
        shown = str(result.receipt) if wide else result.receipt.short
        render.text(f"step {result.step}: cached, receipt {shown}")
        return
    how = "cached" if result.cached else "ran" if result.status == "succeeded" else "failed"
    who = f"step {result.step} (recipe {result.recipe})" if pipeline else f"recipe {result.recipe}"
    rows = (miss_rows(result.miss)
            if result.miss is not None and result.miss.previous is not None else [])
    rows += [["output", name, str(oid)] for name, oid in result.outputs.items()]
    rows += [["claim", name, _compact(value)] for name, value in result.claims.items()]
    rows += [["verdict", name, verdict_text(v)] for name, v in result.verdicts.items()]
    if result.error:
        rows.append(["error", "", result.error])
    title = f"{who}: {how}, receipt {result.receipt}"
    if rows:
        render.table(["item", "name", "value"], rows, title=title, wide=wide)
    else:
        render.text(title)


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
