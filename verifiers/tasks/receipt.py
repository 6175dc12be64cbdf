"""The ``prepare`` and ``conversations`` receipts rechecked (docs/experiment.md §1, §2.1).
"""

from __future__ import annotations

from ..core.runs import Run
from ..records.claims import Findings, environment_section
from ..records.closure import Objects
from .selection import CORPUS_CLAIMS, OUTPUT_CLAIMS, check_selection
from .tasksets import prepare_claims


def check_prepare(objects: Objects, run: Run, found: Findings) -> None:
    def work() -> None:
        checks, values, skipped = prepare_claims(objects, params=run.params, inputs=run.inputs,
                                                 outputs=run.outputs, name=run.name)
        found.checks.extend(checks)
        found.values.update(values)
        found.skipped.update(skipped)
    found.section(f"{run.name}.tasks", ("counts", "counts_by_family", "counts_by_variant",
                                        "damaged_count", "damaged_fail_checker"), work)


def check_conversations(objects: Objects, run: Run, found: Findings) -> None:
    """A conversations run: its sets rechecked, and the selection redone from the corpus."""
    def work() -> None:
        found.checks.extend(check_selection(objects, name=run.name, params=run.params,
                                            inputs=run.inputs, outputs=run.outputs,
                                            values=found.values,
                                            not_rechecked=found.not_rechecked))
    found.section(f"{run.name}.selection", (*CORPUS_CLAIMS, *OUTPUT_CLAIMS), work)
    environment_section(objects, run, found)
