"""Ordering rules (SPEC 7): test-set scores come after, and never before, the commitment.

For an evaluation on a ``test``-role task set:

- ``ordering.commitment``: it cites a ``commitment`` input naming its ``model`` as a subject;
- ``ordering.closure``: nothing the commitment fixed depends on a test-set evaluation: no
  test-role evaluation receipt lies in the commitment's closure or, where the source indexes
  links (a store), among the receipts that produced anything in that closure (provenance);
- ``ordering.time``: the evaluation started no earlier than the commitment existed. The
  commitment's time is the ``finished`` of the earliest receipt that output it, else the
  store's own insertion time of the commitment object.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .closure import Objects, Unusable
from .records import extract_links
from .report import Check


def is_test_evaluation(objects: Objects, oid: str) -> bool:
    """A succeeded or failed ``evaluate`` receipt whose task set has role ``test``."""
    try:
        receipt = objects.record_of(oid, "receipt/1")
        action = objects.record_of(receipt["action"], "action/1")
        if not action["recipe"].startswith("evaluate@") or "tasks" not in action["inputs"]:
            return False
        return objects.record_of(action["inputs"]["tasks"], "tasks/1").get("role") == "test"
    except Unusable:
        return False


def forward_records(objects: Objects, root: str) -> list[str]:
    """Every object reachable from ``root`` through links (only records are read)."""
    seen, order, stack = {root}, [], [root]
    while stack:
        oid = stack.pop()
        order.append(oid)
        if objects.kind(oid) is None:
            continue
        try:
            value = objects.record(oid)
        except Unusable:
            continue
        for link in extract_links(value):
            if link.target not in seen:
                seen.add(link.target)
                stack.append(link.target)
    return order


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
        return float(value)
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
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
                    name: str) -> list[Check]:
    """The three ordering checks of one test-set evaluation (none for other task sets)."""
    inputs = action["inputs"]
    try:
        role = objects.record_of(inputs["tasks"], "tasks/1").get("role")
    except (Unusable, KeyError) as exc:
        return [Check.skipped(f"{name}.ordering", f"task set unusable: {exc}")]
    if role != "test":
        return []
    commitment, model = inputs.get("commitment"), inputs.get("model")
    if commitment is None:
        return [Check.failed(f"{name}.ordering.commitment", "a test-set evaluation must cite a "
                             "commitment that fixed its model first", recomputed=None)]
    try:
        subjects = objects.record_of(commitment, "commitment/1")["subjects"]
    except Unusable as exc:
        return [Check.skipped(f"{name}.ordering.commitment", f"commitment unusable: {exc.why}")]
    checks = [Check.verdict(f"{name}.ordering.commitment", model in subjects.values(),
                            claimed=model, recomputed=sorted(subjects),
                            message="the evaluated model is not among the commitment's subjects")]
    tainted = test_evaluations_behind(objects, commitment)
    checks.append(Check.verdict(f"{name}.ordering.closure", not tainted, recomputed=tainted,
                                message="the commitment depends on test-set evaluation(s): "
                                        + ", ".join(tainted)))
    started = parse_time(receipt.get("started"))
    when, how = commitment_time(objects, commitment)
    if started is None or when is None:
        checks.append(Check.skipped(f"{name}.ordering.time", "cannot date the evaluation or "
                                    f"the commitment ({how})", claimed=receipt.get("started")))
    else:
        checks.append(Check.verdict(
            f"{name}.ordering.time", started >= when, claimed=receipt.get("started"),
            recomputed=datetime.fromtimestamp(when, UTC).isoformat(),
            message=f"the evaluation started before its commitment existed ({how})"))
    return checks
