"""The compare page, read from the store: ``nscas.runs.side_by_side``'s rows (what ``nscas
compare`` prints), and for evaluate runs of one task set each task's answers side by side with
the library's paired statistics (``nscas.models.paired``, the McNemar test the evaluate recipe
claims). Reads only, through a ``StoreReader``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nscas.errors import InvalidInput
from nscas.models.paired import Paired, paired
from nscas.objects.digests import Digest
from nscas.runs.side_by_side import Comparison, compare, receipts_of
from nscas.ui.labels import TASK_COLUMNS, CompareColumns, column_labels, run_labels

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader

COMPARE_PAGE = 100
"""Tasks shown on one page."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Arm:
    receipt: Digest
    label: str
    """The run's arm (``clean-pair``), else its step, else its short ID."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnswerCell:
    text: str
    correct: bool | None
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRow:
    index: int
    id: str
    family: str
    variant: str
    prompt: str
    target: str
    answers: tuple[AnswerCell, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class PairRow:
    baseline: Arm
    candidate: Arm
    paired: Paired


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareFilter:
    family: str | None = None
    variant: str | None = None
    verdict: str | None = None
    """``disagree``, ``all-correct`` or ``all-wrong``."""
    page: int = 1


VERDICTS = ("disagree", "all-correct", "all-wrong")


@dataclass(frozen=True, slots=True, kw_only=True)
class CompareView:
    targets: tuple[str, ...]
    comparison: Comparison
    arms: tuple[Arm, ...]
    columns: CompareColumns
    per_task: bool
    why_not: str | None
    """Why there is no per-task table, when there is none (the members below keep their
    empty defaults then)."""
    pairs: tuple[PairRow, ...] = ()
    tasks: tuple[TaskRow, ...] = ()
    matching: int = 0
    """Tasks passing the filters (``tasks`` is one page of them)."""
    total: int = 0
    families: tuple[str, ...] = ()
    variants: tuple[str, ...] = ()
    page: int = 1
    pages: int = 1


def compare_view(store: StoreReader, targets: Sequence[str], f: CompareFilter) -> CompareView:
    if len(targets) < 2:
        raise InvalidInput("compare needs two or more runs: add ?run=ID for each")
    named = receipts_of(store, targets)
    comparison = compare(store, named)
    arms = tuple(Arm(receipt=r.receipt, label=label)
                 for r, label in zip(comparison.runs, run_labels(comparison.runs, TASK_COLUMNS), strict=True))
    columns = column_labels(comparison)
    why = _why_not_per_task(comparison)
    if why is not None:
        return CompareView(targets=tuple(targets), comparison=comparison, arms=arms,
                           columns=columns, per_task=False, why_not=why)
    first = comparison.runs[0]
    records = _jsonl(store, Digest.parse(store.get_record(first.inputs["tasks"])["records"]))
    ids = [str(r.get("id")) for r in records]
    answers: list[dict[str, dict[str, Any]]] = []
    checks: list[dict[str, dict[str, Any]]] = []
    for run in comparison.runs:
        outputs = store.get_record(run.receipt)["outputs"]
        answers.append({str(x.get("id")): x for x in _jsonl(store, Digest.parse(outputs["generations"]))})
        checks.append({str(x.get("id")): x for x in _jsonl(store, Digest.parse(outputs["checks"]))})
        if list(checks[-1]) != ids:
            return CompareView(targets=tuple(targets), comparison=comparison, arms=arms,
                               columns=columns, per_task=False,
                               why_not=f"{arms[len(checks) - 1].label} scored "
                               "other tasks than its task set lists")
    outcomes = [[(i, c[i].get("correct") is True) for i in ids] for c in checks]
    pairs = tuple(PairRow(baseline=arms[0], candidate=arms[k], paired=paired(outcomes[0], outcomes[k]))
                  for k in range(1, len(arms)))
    rows = []
    for index, r in enumerate(records):
        task = r.get("task")
        if not isinstance(task, dict):
            task = {}
        rows.append(TaskRow(
            index=index + 1, id=str(r.get("id")), family=str(task.get("family", "")),
            variant=str(task.get("variant", "")), prompt=_as_text(r.get("prompt")),
            target=_as_text(r.get("target")),
            answers=tuple(AnswerCell(
                text=_as_text(a.get(str(r.get("id")), {}).get("text", "")),
                correct=c[str(r.get("id"))].get("correct") if isinstance(
                    c[str(r.get("id"))].get("correct"), bool) else None,
                reason=_as_text(c[str(r.get("id"))].get("reason", "")))
                for a, c in zip(answers, checks, strict=True))))
    families = tuple(sorted({t.family for t in rows}))
    variants = tuple(sorted({t.variant for t in rows}, key=lambda v: (len(v), v)))
    for name, value, known in (("family", f.family, families), ("variant", f.variant, variants)):
        if value is not None and value not in known:
            raise InvalidInput(f"no task has {name} {value!r} (known: {', '.join(known)})")
    chosen = [t for t in rows if _keep(t, f)]
    pages = max(1, -(-len(chosen) // COMPARE_PAGE))
    if f.page > pages:
        raise InvalidInput(f"page {f.page} is past the last page ({pages})")
    start = (f.page - 1) * COMPARE_PAGE
    return CompareView(targets=tuple(targets), comparison=comparison, arms=arms,
                       columns=columns, per_task=True, why_not=None, pairs=pairs,
                       tasks=tuple(chosen[start:start + COMPARE_PAGE]),
                       matching=len(chosen), total=len(rows), families=families,
                       variants=variants, page=f.page, pages=pages)


def _why_not_per_task(comparison: Comparison) -> str | None:
    runs = comparison.runs
    if len(runs) < 2:
        return "only one distinct run was named"
    odd = [r for r in runs if not r.recipe.startswith("evaluate@")]
    if odd:
        return (f"{odd[0].step or odd[0].receipt} is a {odd[0].recipe} run: answers are "
                "compared per task between evaluate runs only")
    if any(r.status != "succeeded" for r in runs):
        return "a run failed, so it has no answers"
    if len({r.inputs.get("tasks") for r in runs}) != 1:
        return "the runs evaluated different task sets, so their answers do not pair up"
    return None


def _keep(t: TaskRow, f: CompareFilter) -> bool:
    if f.family is not None and t.family != f.family:
        return False
    if f.variant is not None and t.variant != f.variant:
        return False
    verdicts = {a.correct for a in t.answers}
    if f.verdict == "disagree":
        return len(verdicts) > 1
    if f.verdict == "all-correct":
        return verdicts == {True}
    if f.verdict == "all-wrong":
        return True not in verdicts
    return True


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=1)


def _jsonl(store: StoreReader, oid: Digest) -> list[dict[str, Any]]:
    out = []
    for line in store.get_bytes(oid).decode("utf-8", "replace").splitlines():
        try:
            value = json.loads(line) if line.strip() else None
        except ValueError:  # a line that is not JSON is left out, as a missing answer
            continue
        if isinstance(value, dict):
            out.append(value)
    return out
