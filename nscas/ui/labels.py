"""Labels of the compare page: one per run and one per column, each unique, so no two columns
of a table read the same (two evaluations of the seed checkpoint are both arm ``seed``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from nscas.runs.side_by_side import Comparison, Run


def run_labels(runs: Sequence[Run], reserved: Sequence[str] = ()) -> list[str]:
    """A label per run, each unique and none of ``reserved`` (the other columns of the table
    they head): its arm (else its step, else its short ID), with the step and then the short
    receipt ID added where that alone would name two runs (two evaluations of the seed are
    ``seed · eval-seed`` and ``seed · eval-again``); the same receipt named twice is
    numbered."""
    def choices(r: Run) -> list[str]:
        first = r.arm or r.step or str(r.receipt)[:19]
        step = f"{first} · {r.step}" if r.step and r.step != first else first
        return [first, step, f"{step} · {str(r.receipt)[7:19]}"]

    options = [choices(r) for r in runs]
    labels = [o[0] for o in options]
    for level in (1, 2):
        counts = Counter([*labels, *reserved])
        labels = [o[level] if counts[label] > 1 else label for o, label in zip(
            options, labels, strict=True)]
    counts = Counter([*labels, *reserved])
    seen: Counter[str] = Counter()
    out = []
    for label in labels:
        seen[label] += 1
        out.append(f"{label} #{seen[label]}" if counts[label] > 1 else label)
    return out


TASK_COLUMNS = ("#", "task", "prompt", "target")
"""The per-task table's columns before one per run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareColumns:
    """The runs table's column labels, each unique: a param or claim whose name another column
    has too is labelled ``params.NAME`` or ``claims.NAME`` (as ``nscas compare --sort`` names
    them)."""

    fixed: tuple[str, ...]
    params: tuple[tuple[str, str], ...]
    """(param name, label)."""
    claims: tuple[tuple[str, str], ...]
    """(claim name, label)."""


COMPARE_FIXED = ("run", "step", "recipe", "arm", "status")


def column_labels(c: Comparison) -> CompareColumns:
    taken = Counter([*COMPARE_FIXED, *c.params, *c.claims])
    return CompareColumns(
        fixed=COMPARE_FIXED,
        params=tuple((p, f"params.{p}" if taken[p] > 1 else p) for p in c.params),
        claims=tuple((k, f"claims.{k}" if taken[k] > 1 else k) for k in c.claims))
