"""Task sets (``tasks/1``) regenerated from their seed and wordings, and the ``prepare`` claims.

A grounded task set (role ``test``, ``dev`` or ``train``) names its task ``seed`` and its
``wordings`` blob (``{"header", "wordings": {family: [4 str]}}``). Task ``i`` of the role is
then fixed: case from ``generate_case(seed, role, i)``, prompt ``header + instruction +
visible records`` with ``{q}`` replaced (``str.replace``) by the query, identity, target,
and, in the damaged control (``control: "damaged"``), the damaged target for ids the rule
picks. Every line of the records blob (``{"id", "task", "prompt", "target", "weight"}``) is
compared with that regeneration. A conversation set (``replay``, ``retention``) is checked
for shape and ids on its own; through its ``prepare`` receipt it is also rebuilt, either as
the stand-in set regenerated from ``standin_seed`` and ``replay_count`` / ``retention_count``
(``standin.py``) or, when the run was given the set as an input, as that input's lines in
order with the weight added, and the record and records blob must equal the rebuild.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.errors import RecordParseError, TaskError
from ..core.results import Check
from ..records.closure import Objects, Unusable
from ..records.reading import parse_json
from .checker import (
    FAMILIES,
    check_answer,
    compute_target,
    damaged_target,
    generate_case,
    is_damaged,
    target_text,
    task_identity,
    visible_records,
)
from .standin import StandinError, jsonl_bytes, standin_note, standin_set

GROUNDED = ("test", "dev", "train")
CONVERSATIONS = ("replay", "retention")
RECORD_KEYS = frozenset({"id", "task", "prompt", "target", "weight"})
_SHOWN = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Wordings:
    """A parsed wording object."""

    header: str
    instructions: dict[str, list[str]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One regenerated grounded task."""

    index: int
    case: dict[str, Any]
    prompt: str
    id: str
    clean: dict[str, Any]
    """The clean target object."""


def parse_wordings(data: bytes) -> Wordings:
    """A wording blob; raises ``TaskError`` naming what is malformed."""
    try:
        value = parse_json(data, what="wording object")
    except RecordParseError as exc:
        raise TaskError(exc.message) from None
    if not isinstance(value, dict) or not isinstance(value.get("header"), str):
        raise TaskError("wording object needs a string 'header'")
    families = value.get("wordings")
    if not isinstance(families, dict) or set(families) != set(FAMILIES):
        raise TaskError(f"wording object needs 'wordings' for exactly {list(FAMILIES)}")
    for family, texts in families.items():
        if (not isinstance(texts, list) or len(texts) != 4
                or not all(isinstance(t, str) for t in texts)):
            raise TaskError(f"wordings[{family!r}] must be a list of 4 strings")
    return Wordings(header=value["header"], instructions=families)


def make_prompt(case: Mapping[str, Any], wordings: Wordings) -> str:
    instruction: str = wordings.instructions[case["family"]][case["variant"]]
    return wordings.header + instruction.replace("{q}", case["query"]) + visible_records(case)


def regenerate(seed: int, role: str, count: int, wordings: Wordings) -> list[Task]:
    """Tasks ``0..count-1`` of ``role``, from the seed alone (and the wordings)."""
    tasks = []
    for index in range(count):
        case = generate_case(seed, role, index)
        prompt = make_prompt(case, wordings)
        tasks.append(Task(index=index, case=case, prompt=prompt,
                          id=task_identity(case, prompt), clean=compute_target(case)))
    return tasks


def regenerated(objects: Objects, seed: int, role: str, count: int, wordings_id: str,
                wordings: Wordings) -> list[Task]:
    """``regenerate`` with the wordings of blob ``wordings_id``, once per verification (the
    prepare receipt and each of its task sets ask for the same tasks): callers must not
    change what it returns."""
    key = ("regenerated-tasks", f"{wordings_id} {seed} {role} {count}")
    if key not in objects.memo:
        objects.memo[key] = regenerate(seed, role, count, wordings)
    tasks: list[Task] = objects.memo[key]
    return tasks


def task_lines(objects: Objects, tasks_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A tasks/1 record and its parsed records blob; raises ``Unusable``."""
    record = objects.record_of(tasks_id, "tasks/1")
    try:
        return record, objects.lines(record["records"], "task records")
    except RecordParseError as exc:
        raise Unusable(record["records"], exc.message) from None


def expected_target(task: Task, damaged_control: bool) -> dict[str, Any]:
    if damaged_control and is_damaged(task.id):
        return damaged_target(task.case)
    return task.clean


def _verdict(name: str, problems: list[str], *, recomputed: Any = None,
             claimed: Any = None) -> Check:
    if not problems:
        return Check.passed(name, claimed=claimed, recomputed=recomputed)
    more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
    return Check.failed(name, f"{len(problems)} problem(s): " + "; ".join(problems[:_SHOWN])
                        + more, claimed=claimed, recomputed=recomputed)


def label_of(record: Mapping[str, Any], oid: str) -> str:
    suffix = "-damaged" if record.get("control") == "damaged" else ""
    return f"tasks.{record.get('role')}{suffix}.{oid[7:15]}"


def check_task_set(objects: Objects, oid: str) -> list[Check]:
    """Every finding about one tasks/1 record and its records blob."""
    record = objects.record_of(oid, "tasks/1")
    name = label_of(record, oid)
    try:
        _, lines = task_lines(objects, oid)
    except Unusable as exc:
        if exc.needs is not None:
            return [Check.skipped(f"{name}.lines", f"records blob unusable: {exc.why}",
                                  needs=exc.needs)]
        return [Check.failed(f"{name}.lines", f"records blob unusable: {exc.why}")]
    ids = [line.get("id") for line in lines]
    checks = [_verdict(f"{name}.ids", [] if ids == record["ids"] and record["count"] == len(lines)
                       else [f"record lists {record['count']} ids, the blob holds {len(lines)} "
                             "lines" + ("" if len(ids) != len(record["ids"])
                                        else " with other ids or order")],
                       claimed=record["count"], recomputed=len(lines))]
    role = record["role"]
    if role in CONVERSATIONS:
        return checks + _conversation_checks(name, lines)
    if role not in GROUNDED:
        return [*checks, Check.failed(f"{name}.content", f"role {role!r} is not a known task "
                                      f"role ({', '.join((*GROUNDED, *CONVERSATIONS))}), so "
                                      "nothing checks its content")]
    bad_shape = [f"line {i + 1}" for i, line in enumerate(lines) if set(line) != RECORD_KEYS]
    checks.append(_verdict(f"{name}.lines", bad_shape, recomputed=len(lines)))
    if bad_shape:
        return checks
    return checks + _grounded_checks(objects, name, record, lines)


def _grounded_checks(objects: Objects, name: str, record: Mapping[str, Any],
                     lines: list[dict[str, Any]]) -> list[Check]:
    damaged_control = record.get("control") == "damaged"
    seed, wordings_id = record.get("seed"), record.get("wordings")
    checks: list[Check] = []
    if not isinstance(seed, int) or isinstance(seed, bool) or not isinstance(wordings_id, str):
        checks.append(Check.failed(f"{name}.regenerated", "the record names no task seed and "
                                   "wordings, so the tasks cannot be regenerated"))
        tasks = None
    else:
        try:
            wordings = parse_wordings(objects.bytes(wordings_id))
        except Unusable as exc:
            checks.append(Check.failed(f"{name}.regenerated", f"wordings unusable: {exc.why}"))
            tasks = None
        except TaskError as exc:
            checks.append(Check.failed(f"{name}.regenerated", exc.message))
            tasks = None
        else:
            tasks = regenerated(objects, seed, record["role"], len(lines), wordings_id,
                                wordings)
            wrong = [f"line {t.index + 1}: " + ", ".join(
                what for what, ok in (("case", line["task"] == t.case),
                                      ("prompt", line["prompt"] == t.prompt),
                                      ("id", line["id"] == t.id)) if not ok)
                     for t, line in zip(tasks, lines, strict=True)
                     if (line["task"], line["prompt"], line["id"]) != (t.case, t.prompt, t.id)]
            checks.append(_verdict(f"{name}.regenerated", wrong, recomputed=len(tasks)))
    # Identities and targets are also checked from each line's own case, so a set without a
    # seed is still held to the rules.
    identity, targets, damaged_pass = [], [], []
    for number, line in enumerate(lines, start=1):
        try:
            if task_identity(line["task"], line["prompt"]) != line["id"]:
                identity.append(f"line {number}: id is not the SHA-256 of its task and prompt")
            task = Task(index=number - 1, case=line["task"], prompt=line["prompt"],
                        id=line["id"], clean=compute_target(line["task"]))
            want = expected_target(task, damaged_control)
        except (TaskError, TypeError, KeyError, ValueError) as exc:
            targets.append(f"line {number}: unusable case ({exc})")
            continue
        if line["target"] != target_text(want):
            targets.append(f"line {number}: target {line['target']} is not {target_text(want)}")
        if want is not task.clean and check_answer(target_text(want), task.clean).correct:
            damaged_pass.append(f"line {number}: damaged target passes the checker")
    checks.append(_verdict(f"{name}.identities", identity, recomputed=len(lines)))
    checks.append(_verdict(f"{name}.targets", targets, recomputed=len(lines)))
    if damaged_control:
        checks.append(_verdict(f"{name}.damaged_fail_checker", damaged_pass,
                               recomputed=sum(1 for t in lines if is_damaged(t["id"]))))
    return checks


def _conversation_checks(name: str, lines: list[dict[str, Any]]) -> list[Check]:
    problems = []
    for number, line in enumerate(lines, start=1):
        messages = line.get("messages")
        if not isinstance(line.get("id"), str) or not isinstance(messages, list) or not messages:
            problems.append(f"line {number}: needs an id and a non-empty messages list")
        elif not all(isinstance(m, dict) and set(m) == {"role", "content"} for m in messages):
            problems.append(f"line {number}: every message needs exactly role and content")
        elif messages[-1]["role"] != "assistant":
            problems.append(f"line {number}: does not end with an assistant turn")
    return [_verdict(f"{name}.lines", problems, recomputed=len(lines))]


# --- the prepare recipe ------------------------------------------------------------------

def prepare_claims(objects: Objects, *, params: Mapping[str, Any], inputs: Mapping[str, str],
                   outputs: Mapping[str, str],
                   name: str) -> tuple[list[Check], dict[str, Any], dict[str, str]]:
    """Rule checks, recomputed claim values and skipped claims of one prepare receipt."""
    checks: list[Check] = []
    values: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    records = {role: objects.record_of(outputs[role], "tasks/1")
               for role in (*GROUNDED, "damaged", *CONVERSATIONS) if role in outputs}
    seed = params.get("seed")
    counts = params.get("counts")
    if not isinstance(counts, dict):
        counts = {}
    wordings_id = inputs.get("wordings") or records.get("test", {}).get("wordings")
    problems = []
    for role, rec in records.items():
        # What each output is comes from the output name, so its label must say the same: a
        # test set relabelled in its record would escape the rules that key on the label.
        want = ("train", "damaged") if role == "damaged" else (role, None)
        if (rec.get("role"), rec.get("control")) != want:
            problems.append(f"{role}: labelled role {rec.get('role')!r}, control "
                            f"{rec.get('control')!r}, expected {want[0]!r}, {want[1]!r}")
        if role in (*GROUNDED, "damaged"):
            if rec.get("seed") != seed:
                problems.append(f"{role}: seed {rec.get('seed')} is not the param {seed}")
            if rec.get("wordings") != wordings_id:
                problems.append(f"{role}: wordings {rec.get('wordings')} differ")
    checks.append(_verdict(f"{name}.seed_and_wordings", problems, recomputed=seed))
    wordings = parse_wordings(objects.bytes(wordings_id)) if wordings_id else None
    if wordings is None or not isinstance(seed, int):
        reason = "the task seed or wordings are unknown"
        return checks, values, {c: reason for c in ("counts", "counts_by_family",
                                                    "counts_by_variant", "damaged_count",
                                                    "damaged_fail_checker")}
    roles = {role: regenerated(objects, seed, role, int(counts.get(role, 0)), str(wordings_id),
                               wordings) for role in GROUNDED}
    values["counts"] = {role: len(tasks) for role, tasks in roles.items()}
    values["counts_by_family"] = {role: {f: sum(1 for t in tasks if t.case["family"] == f)
                                         for f in FAMILIES} for role, tasks in roles.items()}
    values["counts_by_variant"] = {
        role: {str(v): n for v, n in sorted(Counter(t.case["variant"] for t in tasks).items())}
        for role, tasks in roles.items()}
    damaged = [t for t in roles["train"] if is_damaged(t.id)]
    values["damaged_count"] = len(damaged)
    values["damaged_fail_checker"] = all(
        not check_answer(target_text(damaged_target(t.case)), t.clean).correct for t in damaged)
    set_problems = []
    for role, tasks in (*roles.items(), ("damaged", roles["train"])):
        made = records.get(role)
        if made is None:
            set_problems.append(f"output {role!r} is missing")
        elif made["ids"] != [t.id for t in tasks]:
            set_problems.append(f"{role}: ids differ from the regenerated tasks")
    prompts = Counter(t.prompt for tasks in roles.values() for t in tasks)
    repeated = [p for p, n in prompts.items() if n > 1]
    if repeated:
        set_problems.append(f"{len(repeated)} prompt(s) repeat across roles")
    checks.append(_verdict(f"{name}.task_sets", set_problems,
                           recomputed=values["counts"]))
    checks.extend(_weights(objects, records, params, f"{name}.weights"))
    for kind in CONVERSATIONS:
        if kind in records:
            checks.append(_conversations_rebuilt(objects, records[kind], kind, params=params,
                                                 inputs=inputs, name=f"{name}.{kind}.regenerated"))
    for kind in CONVERSATIONS:
        conversations = records.get(kind)
        if conversations is None:
            skipped[f"{kind}_count"] = f"output {kind!r} is missing"
            continue
        try:
            values[f"{kind}_count"] = len(objects.lines(conversations["records"], kind))
        except RecordParseError as exc:
            skipped[f"{kind}_count"] = exc.message
    if "prepared" in outputs:
        subjects = objects.record_of(outputs["prepared"], "commitment/1")["subjects"]
        expected: dict[str, str | None] = {k: v for k, v in outputs.items() if k != "prepared"}
        expected["wordings"] = wordings_id
        checks.append(_verdict(f"{name}.prepared", [] if subjects == expected else
                               ["the prepared commitment does not name exactly the outputs and "
                                "the wordings"], recomputed=sorted(expected)))
    for arm in ("clean", "damaged"):
        for claim in ("targets", "weighted_targets"):
            skipped[f"{arm}.{claim}"] = ("needs the tokenizer's chat-template rendering of every "
                                         "document; not recomputed here")
    return checks, values, skipped


def _conversations_rebuilt(objects: Objects, record: Mapping[str, Any], kind: str, *,
                           params: Mapping[str, Any], inputs: Mapping[str, str],
                           name: str) -> Check:
    """The conversation set ``kind`` of a prepare run against its rebuild from params/inputs.

    Without an input the recipe generates the stand-in set of ``<kind>_count`` conversations
    from ``standin_seed``; with one it takes every line of the input, in order (the count
    param is then unused). Either way each records line is the conversation plus its weight
    (``replay_weight`` for replay, 1 for retention).
    """
    weight = params.get("replay_weight") if kind == "replay" else 1
    count, seed = params.get(f"{kind}_count"), params.get("standin_seed")
    standin = kind not in inputs
    if standin:
        try:
            conversations = standin_set(kind, count, seed)
        except StandinError as exc:
            return Check.failed(name, f"the stand-in set cannot be regenerated: {exc}")
        source = f"the stand-in set for seed {seed}, count {count}"
    else:
        try:
            conversations = objects.lines(inputs[kind], f"{kind} input")
        except RecordParseError as exc:
            return Check.failed(name, f"the {kind} input is unreadable: {exc.message}")
        source = f"the {kind} input"
    expected = [{**c, "weight": weight} for c in conversations]
    problems = []
    if record.get("standin") is not standin:
        problems.append(f"the record says standin {record.get('standin')!r}, but the run "
                        + ("had no" if standin else "had a") + f" {kind} input")
    # standin_set accepted count and seed, so with a stand-in set both are integers.
    want_note = (standin_note(count, seed)
                 if standin and isinstance(count, int) and isinstance(seed, int) else None)
    if record.get("note") != want_note:
        problems.append(f"note {record.get('note')!r} is not {want_note!r}")
    if record.get("count") != len(expected):
        problems.append(f"count {record.get('count')!r} is not {len(expected)}")
    if record.get("ids") != [c.get("id") for c in conversations]:
        problems.append(f"ids differ from {source}")
    try:
        data = objects.bytes(record["records"])
    except Unusable as exc:
        problems.append(f"records blob unusable: {exc.why}")
    else:
        if data != jsonl_bytes(expected):
            lines = data.split(b"\n")[:-1] if data.endswith(b"\n") else data.split(b"\n")
            want = jsonl_bytes(expected).split(b"\n")[:-1]
            wrong = [str(i + 1) for i, (a, b) in enumerate(zip(lines, want, strict=False))
                     if a != b]
            problems.append(f"records blob is not {source} with weight {weight!r}: "
                            f"{len(lines)} line(s) for {len(want)}"
                            + (f", line(s) {', '.join(wrong[:_SHOWN])} differ" if wrong else ""))
    return _verdict(name, problems, claimed=record.get("count"), recomputed=len(expected))


def _weights(objects: Objects, records: Mapping[str, Mapping[str, Any]],
             params: Mapping[str, Any], name: str) -> list[Check]:
    expected = {"test": 1, "dev": 1, "train": params.get("grounded_weight"),
                "damaged": params.get("grounded_weight"), "replay": params.get("replay_weight"),
                "retention": 1}
    problems = []
    for role, rec in records.items():
        try:
            lines = objects.lines(rec["records"], role)
        except (RecordParseError, Unusable) as exc:
            problems.append(f"{role}: records unusable ({exc.message})")
            continue
        wrong = sum(1 for line in lines if line.get("weight") != expected[role])
        if wrong:
            problems.append(f"{role}: {wrong} line(s) do not weigh {expected[role]}")
    return [_verdict(name, problems, recomputed=json.dumps(expected, sort_keys=True))]
