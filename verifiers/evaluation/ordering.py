"""Ordering rules (docs/format.md §7): test-set scores come after, and never before, the commitment.

Which evaluations score the test set is decided by lineage and content, never by a label
alone. The *test sets of an evaluation's lineage* are the ``test`` outputs of the ``prepare``
receipts, the ``test`` subjects of the commitments and the task sets labelled ``test`` among
the objects its provenance reaches (its action's inputs, the commitment and what that fixed,
and, where the source indexes links, the receipts that produced any of them). An evaluation
scores the test set when its task set is labelled ``test``, is one of those test sets, or
shares any task id with one (``is_test_evaluation``). ``ordering.test_set`` holds for every
evaluation: a task set holding test tasks must be labelled ``test``, and one labelled
``test`` must hold the lineage's test tasks when the lineage has any.

For an evaluation that scores the test set:

- ``ordering.commitment``: it cites a ``commitment`` input naming its ``model`` as a subject;
- ``ordering.closure``: nothing the commitment fixed depends on a test-set evaluation: no
  test-role evaluation receipt lies in the commitment's closure or, where the source indexes
  links (a store), among the receipts that produced anything in that closure (provenance);
- ``ordering.time``: the evaluation started no earlier than the commitment existed. The
  commitment's time is the ``finished`` of the earliest receipt that output it, else the
  store's own insertion time of the commitment object. Where neither is in the source (a
  bundle of the evaluation alone), the order is the one the link itself proves: the
  evaluation's action names the commitment by ID, so the commitment existed first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from ..core.results import Check
from ..records.closure import Objects, Unusable


def _evaluation_tasks(objects: Objects, oid: str) -> str | None:
    """The task set an ``evaluate`` receipt scored, or None for any other receipt."""
    try:
        receipt = objects.record_of(oid, "receipt/1")
        action = objects.record_of(receipt["action"], "action/1")
    except Unusable:
        return None
    recipe, inputs = action.get("recipe"), action.get("inputs")
    if not isinstance(recipe, str) or not recipe.startswith("evaluate@"):
        return None
    tasks = inputs.get("tasks") if isinstance(inputs, Mapping) else None
    return tasks if isinstance(tasks, str) else None


def lineage(objects: Objects, oid: str) -> set[str]:
    """What ``oid`` stems from: its provenance where the source indexes links, else the
    objects it reaches (memoised)."""
    key = ("lineage", oid)
    if key not in objects.memo:
        indexed = objects.source.parents(oid) is not None
        objects.memo[key] = provenance(objects, [oid]) if indexed else set(
            forward_records(objects, oid))
    found: set[str] = objects.memo[key]  # the memo holds the set computed for this key
    return found


def test_sets(objects: Objects, reach: set[str]) -> dict[str, frozenset[str]]:
    """The test sets among ``reach`` (tasks/1 ID -> its task ids): ``test`` outputs of
    prepare receipts, ``test`` subjects of commitments, task sets labelled ``test``."""
    found: set[str] = set()
    for oid in reach:
        kind = objects.kind(oid)
        try:
            if kind == "receipt/1":
                record = objects.record(oid)
                action = objects.record_of(record["action"], "action/1")
                if str(action.get("recipe", "")).startswith("prepare@") and isinstance(
                        record.get("outputs"), Mapping) and "test" in record["outputs"]:
                    found.add(record["outputs"]["test"])
            elif kind == "commitment/1":
                subjects = objects.record(oid).get("subjects")
                if isinstance(subjects, Mapping) and isinstance(subjects.get("test"), str):
                    found.add(subjects["test"])
            elif kind == "tasks/1" and objects.record(oid).get("role") == "test":
                found.add(oid)
        except Unusable:
            continue
    sets = {}
    for oid in sorted(found):
        try:
            ids = objects.record_of(oid, "tasks/1").get("ids")
        except Unusable:
            ids = []
        sets[oid] = frozenset(i for i in ids if isinstance(i, str)) if isinstance(
            ids, list) else frozenset()
    return sets


def test_scoring(objects: Objects, oid: str) -> tuple[bool, str]:
    """Whether receipt ``oid`` is an evaluation that scores the test set, and why."""
    tasks = _evaluation_tasks(objects, oid)
    if tasks is None:
        return False, "not an evaluation"
    try:
        record = objects.record_of(tasks, "tasks/1")
    except Unusable as exc:
        # An unreadable task set may be anything: treat it as the test set (stricter).
        return True, f"its task set is unusable ({exc.why}), so it may be the test set"
    if record.get("role") == "test":
        return True, "its task set is labelled test"
    sets = test_sets(objects, lineage(objects, oid))
    if tasks in sets:
        return True, "its task set is the test set of its lineage"
    ids = record.get("ids")
    if not isinstance(ids, list):
        ids = []
    shared = {i for i in ids if isinstance(i, str)} & set().union(*sets.values())
    if shared:
        return True, f"its task set shares {len(shared)} task id(s) with the test set"
    return False, "its task set holds no test task"


def is_test_evaluation(objects: Objects, oid: str) -> bool:
    """An ``evaluate`` receipt (of any status) that scores the test set: by its task set's
    lineage and content, or its label (see the module docstring)."""
    return test_scoring(objects, oid)[0]


def test_set_check(objects: Objects, receipt_id: str, tasks: str, name: str) -> Check:
    """``<name>.ordering.test_set``: the task set's ``test`` label and its content agree."""
    check = f"{name}.ordering.test_set"
    try:
        record = objects.record_of(tasks, "tasks/1")
    except Unusable as exc:
        return Check.failed(check, f"the task set is unusable: {exc.why}")
    sets = test_sets(objects, lineage(objects, receipt_id))
    role = record.get("role")
    ids = {i for i in record.get("ids", []) if isinstance(i, str)} if isinstance(
        record.get("ids"), list) else set()
    test_ids = set().union(*sets.values()) if sets else set()
    shared = ids & test_ids
    if role != "test" and (tasks in sets or shared):
        return Check.failed(check, f"the task set is labelled {role!r} but holds "
                                   f"{len(shared) or len(ids)} task(s) of the test set",
                            claimed=role, recomputed="test")
    if role == "test" and sets and tasks not in sets and not shared:
        return Check.failed(check, "the task set is labelled test but holds none of the test "
                                   "tasks of its lineage", claimed=role,
                            recomputed=sorted(sets))
    return Check.passed(check, claimed=role, recomputed=len(shared))


def forward_records(objects: Objects, root: str) -> list[str]:
    """Every object reachable from ``root`` through links (only records are read); walked
    once per root and verification (``objects.memo``), as every evaluation asks again."""
    key = ("forward-records", root)
    if key not in objects.memo:
        seen, order, stack = {root}, [], [root]
        while stack:
            oid = stack.pop()
            order.append(oid)
            if objects.kind(oid) is None:
                continue
            try:
                links = objects.links(oid)
            except Unusable:
                continue
            for link in links:
                if link.target not in seen:
                    seen.add(link.target)
                    stack.append(link.target)
        objects.memo[key] = tuple(order)
    return list(objects.memo[key])


def producers(objects: Objects, oid: str) -> list[str]:
    """Receipts (that the source can find) listing ``oid`` among their outputs."""
    found = []
    for parent in objects.source.parents(oid) or []:
        if objects.kind(parent) != "receipt/1":
            continue
        try:
            record = objects.record(parent)
        except Unusable:
            continue
        if oid in record.get("outputs", {}).values():
            found.append(parent)
    return found


def provenance(objects: Objects, roots: list[str]) -> set[str]:
    """Objects reachable from ``roots`` plus, transitively, the receipts that output any record
    among them and everything those receipts link (their actions and the actions' inputs)."""
    seen: set[str] = set()
    frontier = list(roots)
    while frontier:
        oid = frontier.pop()
        if oid in seen:
            continue
        seen.add(oid)
        for reached in forward_records(objects, oid):
            if reached not in seen:
                frontier.append(reached)
            # Records only: identical blobs are shared by unrelated runs (two evaluations
            # that output the same losses), so a blob's producers say nothing about origin.
            if objects.kind(reached) is not None:
                frontier.extend(p for p in producers(objects, reached) if p not in seen)
    return seen


def test_evaluations_behind(objects: Objects, commitment: str) -> list[str]:
    """Test-role evaluation receipts the commitment's subjects depend on."""
    indexed = objects.source.parents(commitment) is not None
    reach = provenance(objects, [commitment]) if indexed else set(forward_records(objects,
                                                                                  commitment))
    return sorted(oid for oid in reach if objects.kind(oid) == "receipt/1"
                  and is_test_evaluation(objects, oid))


def parse_time(value: Any) -> float | None:
    """A receipt time (ISO 8601 with offset, or seconds since the epoch) as epoch seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:
            return None
        return seconds if math.isfinite(seconds) and abs(seconds) < 1e11 else None
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        try:
            return moment.timestamp()
        except (OverflowError, ValueError, OSError):
            return None
    return None


def commitment_time(objects: Objects, commitment: str) -> tuple[float | None, str]:
    """When the commitment existed, and how that is known."""
    times = []
    for receipt in producers(objects, commitment):
        finished = parse_time(objects.record(receipt).get("finished"))
        if finished is not None:
            times.append((finished, f"finished of receipt {receipt}"))
    if times:
        return min(times)
    created = objects.source.created(commitment)
    if created is not None:
        return created, "the store's insertion time of the commitment"
    return None, "no receipt in this source outputs the commitment"


def ordering_checks(objects: Objects, receipt: Mapping[str, Any], action: Mapping[str, Any],
                    name: str, receipt_id: str | None = None) -> list[Check]:
    """``ordering.test_set`` for every evaluation, and the three ordering checks of one that
    scores the test set (decided by lineage and content, see ``test_scoring``)."""
    inputs = action["inputs"]
    tasks = inputs.get("tasks")
    if not isinstance(tasks, str):
        return [Check.failed(f"{name}.ordering", "the evaluation names no task set")]
    checks: list[Check] = []
    if receipt_id is not None:
        checks.append(test_set_check(objects, receipt_id, tasks, name))
        scores_test, why = test_scoring(objects, receipt_id)
    else:
        try:
            role = objects.record_of(tasks, "tasks/1").get("role")
        except Unusable as exc:
            return [Check.failed(f"{name}.ordering", f"task set unusable: {exc.why}")]
        scores_test, why = role == "test", "its task set is labelled test"
    if not scores_test:
        return checks
    commitment, model = inputs.get("commitment"), inputs.get("model")
    if commitment is None:
        return [*checks, Check.failed(
            f"{name}.ordering.commitment", f"a test-set evaluation ({why}) must cite a "
            "commitment that fixed its model first", recomputed=None)]
    try:
        subjects = objects.record_of(commitment, "commitment/1")["subjects"]
    except Unusable as exc:
        return [*checks, Check.failed(f"{name}.ordering.commitment",
                                      f"commitment unusable: {exc.why}")]
    checks.append(Check.verdict(f"{name}.ordering.commitment", model in subjects.values(),
                                claimed=model, recomputed=sorted(subjects),
                                message="the evaluated model is not among the commitment's "
                                        f"subjects ({why})"))
    tainted = test_evaluations_behind(objects, commitment)
    checks.append(Check.verdict(f"{name}.ordering.closure", not tainted, recomputed=tainted,
                                message="the commitment depends on test-set evaluation(s): "
                                        + ", ".join(tainted)))
    started = parse_time(receipt.get("started"))
    when, how = commitment_time(objects, commitment)
    if started is None:
        checks.append(Check.failed(f"{name}.ordering.time", "the evaluation's start is not a "
                                   "time", claimed=receipt.get("started")))
    elif when is None:
        # The action names the commitment by its ID, so the commitment (and the candidates it
        # fixes) existed before this run was even defined; a clock adds nothing to that.
        checks.append(Check.passed(f"{name}.ordering.time", claimed=receipt.get("started"),
                                   recomputed="ordered by the action's link to the commitment",
                                   message=f"no clock to compare ({how})"))
    else:
        checks.append(Check.verdict(
            f"{name}.ordering.time", started >= when, claimed=receipt.get("started"),
            recomputed=datetime.fromtimestamp(when, UTC).isoformat(),
            message=f"the evaluation started before its commitment existed ({how})"))
    return checks
