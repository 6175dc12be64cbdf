"""The ``serve`` receipt rechecked (docs/experiment.md §5): its request log, and that it served
what its commitment fixed.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.errors import LogFormatError
from ..core.results import Check
from ..core.runs import Run
from ..records.claims import Findings, environment_section
from ..records.closure import Objects
from .throughput import ServeRun, check_serving


def check_serve(objects: Objects, run: Run, found: Findings) -> None:
    def work() -> None:
        log = objects.bytes(run.outputs["requests"])
        claims = {k: c["value"] for k, c in run.receipt["claims"].items()
                  if c["verifier"] == "throughput"}
        prefix = f"{run.name}.claims"
        facts = serve_run(objects, run, found)
        try:
            checks = check_serving(log, claims, prefix=prefix, run=facts)
        except LogFormatError as exc:
            found.checks.append(Check.failed(f"{run.name}.requests", exc.message))
            for claim in claims:
                found.skipped[claim] = "the request log is unusable"
            return
        for check in checks:
            claim = check.name.removeprefix(prefix + ".")
            if check.name.startswith(prefix + ".") and claim in claims:
                found.decided[claim] = check
            else:  # a serving rule, not a claim: named beside the receipt's other rules
                found.checks.append(replace(check, name=f"{run.name}.{claim}"))
    found.section(f"{run.name}.requests", (), work)
    environment_section(objects, run, found)


def serve_run(objects: Objects, run: Run, found: Findings) -> ServeRun:
    """The serve action's facts about its log, and ``<run>.committed``: the served model and
    task set are those its commitment fixed (the model a subject, the tasks the dev set of
    the committed prepared inputs)."""
    tasks = objects.record_of(run.inputs["tasks"], "tasks/1")
    task_ids = tuple(i for i in tasks["ids"] if isinstance(i, str))
    committed_dev, problems = None, []
    commitment = run.inputs.get("commitment")
    if commitment is None:
        problems.append("the serve cites no commitment")
    else:
        subjects = objects.record_of(commitment, "commitment/1")["subjects"]
        if run.inputs.get("model") not in subjects.values():
            problems.append("the served model is not a subject of its commitment")
        prepared = subjects.get("prepared")
        if prepared is None:
            problems.append("the commitment fixes no prepared inputs")
        else:
            dev = objects.record_of(prepared, "commitment/1")["subjects"].get("dev")
            if dev is None:
                problems.append("the prepared inputs hold no dev set")
            else:
                committed_dev = frozenset(objects.record_of(dev, "tasks/1")["ids"])
                if dev != run.inputs["tasks"]:
                    problems.append("the served task set is not the committed dev set")
    found.checks.append(Check.verdict(f"{run.name}.committed", not problems,
                                      recomputed=len(committed_dev or ()),
                                      message="; ".join(problems)))
    return ServeRun(run_id=run.receipt["action"].removeprefix("blake3:")[:12],
                    task_ids=task_ids, committed_dev=committed_dev,
                    requests=run.params.get("requests"), replicas=run.params.get("replicas"),
                    attempts=run.params.get("attempts"))
