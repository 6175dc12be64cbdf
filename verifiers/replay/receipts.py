"""Replay of a verified target's runs: every evaluate run's sampled answers
(``replay.answers``) and every train run's updates (``replay.training``), and one check naming
where the replay ran.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..core.results import Check
from ..core.runs import Run
from ..records.closure import Objects, Unusable, weights_omitted
from .answers import replay_precision, replay_run, run_precision
from .greedy import Tolerance
from .options import ReplayOptions, environment
from .training import replay_trainings


def replay_receipts(objects: Objects, receipts: Sequence[str], options: ReplayOptions
                    ) -> list[Check]:
    """``replay_evaluations`` of the succeeded evaluate runs among ``receipts`` (in order);
    receipts that cannot be read are plain verification's findings, not replay's."""
    runs = []
    for oid in receipts:
        try:
            receipt = objects.record_of(oid, "receipt/1")
            action = objects.record_of(receipt["action"], "action/1")
        except Unusable:
            continue
        recipe = str(action.get("recipe", "")).partition("@")[0]
        if recipe in ("evaluate", "train") and receipt.get("status") == "succeeded":
            runs.append(Run(id=oid, name=f"{recipe}.{oid[7:15]}", receipt=receipt,
                            action=action, recipe=recipe))
    return replay_evaluations(objects, runs, options)


def replay_evaluations(objects: Objects, runs: Sequence[Run], options: ReplayOptions
                       ) -> list[Check]:
    """A ``replay`` check per evaluate run, a ``replay.training`` check per train run when
    ``options.steps`` > 0 (``replay.training``), and one naming where the replay ran."""
    evaluations = [r for r in runs if r.recipe == "evaluate"]
    checks: list[Check] = []
    deadline = None if options.time_limit is None else time.monotonic() + options.time_limit
    precisions = set()
    for run in evaluations:
        name = f"{run.name}.replay"
        tolerance = Tolerance(run=run_precision(run), replay=replay_precision(run, options.device))
        precisions.add(tolerance.replay)
        if weights_omitted(objects, run.inputs["model"]):
            checks.append(Check.skipped(name, "the bundle omits the weights a replay needs",
                                        needs="weights"))
            continue
        try:
            checks.extend(replay_run(objects, run, options, tolerance, deadline, name))
        except Unusable as exc:
            checks.append(Check.failed(name, f"cannot replay: {exc}"))
    trained = replay_trainings(objects, runs, options)
    checks.extend(trained)
    if evaluations or trained:
        env = environment(options.device, "/".join(sorted(precisions)) or "fp32")
        checks.append(Check.passed(
            "replay.environment", recomputed={**env, "seed": options.seed,
                                              "count": options.count,
                                              "steps": options.steps},
            message=f"replayed on {env.get('device_name', env['device'])} "
                    f"({env['precision']}, torch {env['torch']}), seed {options.seed}"))
    return checks
