"""Grounded tasks of docs/experiment.md §1: cases, wordings, prompts, identities, targets, damage.

Everything here is a pure function of (seed, role, index, wordings). The draw order follows
the published experiment exactly, so with the same wordings the same task identities come out.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from types import MappingProxyType
from typing import Any

from nscas.errors import InvalidInput, RecipeError

from .checker import check

FAMILIES = ("lookup", "filter", "total", "sort")
QUERY_FAMILIES = ("lookup",)
"""Families whose task is about the query id: their instructions must name it as ``{q}``
(the published wordings use it there only); elsewhere ``{q}`` is allowed, not required."""
ROLES = ("test", "dev", "train")
"""Generation order of the roles; it decides which task keeps a prompt if one ever repeats."""
CITIES = ("Oslo", "Lima", "Kyoto", "Accra", "Perth", "Riga", "Bern", "Suva")
STATUSES = ("ready", "pending", "closed")
ABSENT_ID = "Z000"
DEFAULT_SEED = 2026091301
DEFAULT_COUNTS: Mapping[str, int] = MappingProxyType({"test": 256, "dev": 64, "train": 768})
INSTRUCTIONS_PER_FAMILY = 4
VISIBLE_FIELDS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "lookup": ("id", "city", "units"),
    "filter": ("id", "status"),
    "total": ("id", "units", "price"),
    "sort": ("id", "priority"),
})
"""The row fields a prompt shows, per family, in this order."""


class WordingError(InvalidInput):
    """A wording object is malformed; ``family`` and ``index`` say where, when they apply."""

    def __init__(self, message: str, *, family: str | None = None, index: int | None = None):
        where = ""
        if family is not None:
            where = f"wordings[{family!r}]" + (f"[{index}]" if index is not None else "")
            where += ": "
        super().__init__(f"wording object: {where}{message}")
        self.family = family
        self.index = index


@dataclass(frozen=True, slots=True, kw_only=True)
class Wordings:
    """How prompts are phrased: JSON ``{"header": str, "wordings": {family: [4 str]}}``."""

    header: str
    """Text every prompt starts with, immediately followed by the instruction."""
    instructions: Mapping[str, tuple[str, ...]]
    """Per family, four instructions; ``{q}`` stands for the query id; index = variant."""
    description: str = ""
    """Free text saying whose wordings these are; not part of any prompt."""

    def to_json(self) -> dict[str, Any]:
        value: dict[str, Any] = {"header": self.header}
        if self.description:
            value["description"] = self.description
        value["wordings"] = {f: list(self.instructions[f]) for f in FAMILIES}
        return value


def parse_wordings(value: object) -> Wordings:
    """Validate a decoded wording object; every error names the family and index at fault."""
    if not isinstance(value, dict):
        raise WordingError(f"expected a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - {"header", "wordings", "description"})
    if unknown:
        raise WordingError(f"unknown key(s) {unknown}; allowed: header, wordings, description")
    header = value.get("header")
    if not isinstance(header, str):
        raise WordingError("'header' must be a string")
    description = value.get("description", "")
    if not isinstance(description, str):
        raise WordingError("'description' must be a string")
    families = value.get("wordings")
    if not isinstance(families, dict):
        raise WordingError("'wordings' must be an object with one list per family")
    extra = sorted(set(families) - set(FAMILIES))
    if extra:
        raise WordingError(f"unknown family name(s) {extra}; expected {list(FAMILIES)}")
    instructions: dict[str, tuple[str, ...]] = {}
    for family in FAMILIES:
        texts = families.get(family)
        if texts is None:
            raise WordingError("missing", family=family)
        if not isinstance(texts, list) or len(texts) != INSTRUCTIONS_PER_FAMILY:
            raise WordingError(
                f"expected a list of exactly {INSTRUCTIONS_PER_FAMILY} strings", family=family
            )
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise WordingError(f"expected a string, got {type(text).__name__}",
                                   family=family, index=index)
            if family in QUERY_FAMILIES and "{q}" not in text:
                raise WordingError("lacks the '{q}' placeholder for the query id, which a "
                                   f"{family} instruction must name", family=family, index=index)
        instructions[family] = tuple(texts)
    return Wordings(header=header, instructions=instructions, description=description)


def parse_wordings_bytes(data: bytes) -> Wordings:
    """Decode a wording object stored as a UTF-8 JSON blob, then validate it."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise WordingError(f"not UTF-8 JSON: {exc}") from exc
    return parse_wordings(value)


def default_wordings_bytes() -> bytes:
    """The bytes of nscas's own default wording object, as shipped in the package."""
    return resources.files(__package__).joinpath("default_wordings.json").read_bytes()


def default_wordings() -> Wordings:
    return parse_wordings_bytes(default_wordings_bytes())


# --- cases, prompts, identities, targets ------------------------------------------------


def case_rng(seed: int, role: str, index: int) -> random.Random:
    """The one RNG of a case, seeded from SHA-256 so it is the same on every platform."""
    digest = hashlib.sha256(f"{seed}:{role}:{index}".encode()).hexdigest()
    return random.Random(int(digest, 16))


def make_case(seed: int, role: str, index: int) -> dict[str, Any]:
    """``{"family", "rows", "query", "variant"}``; the draws happen in the published order."""
    rng = case_rng(seed, role, index)
    numbers = rng.sample(range(100, 1000), 5)
    rows = []
    for number in numbers:
        # One statement per draw: the order of rng calls is part of every task identity.
        row_id = chr(65 + rng.randrange(26)) + str(number)
        city = rng.choice(CITIES)
        units = rng.randrange(0, 20)
        price = rng.randrange(1, 20)
        status = rng.choice(STATUSES)
        priority = rng.randrange(1, 10)
        rows.append({"id": row_id, "city": city, "units": units, "price": price,
                     "status": status, "priority": priority})
    query = rng.choice(rows)["id"] if index % 5 != 0 else ABSENT_ID
    variant = (index // 4) % (4 if role == "test" else 2)
    return {"family": FAMILIES[index % 4], "rows": rows, "query": query, "variant": variant}


def make_prompt(case: Mapping[str, Any], wordings: Wordings) -> str:
    family = case["family"]
    # str.replace, not str.format: instructions may show literal JSON braces.
    instruction = wordings.instructions[family][case["variant"]].replace("{q}", case["query"])
    fields = VISIBLE_FIELDS[family]
    visible = [{name: row[name] for name in fields} for row in case["rows"]]
    records = json.dumps(visible, separators=(",", ":"))
    return wordings.header + instruction + "\nRecords:\n" + records


def task_identity(case: Mapping[str, Any], prompt: str) -> str:
    """SHA-256 hex of the published identity form of (case, prompt)."""
    text = json.dumps({"task": case, "prompt": prompt}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def target_value(case: Mapping[str, Any]) -> dict[str, Any]:
    """The clean answer as a JSON value, keys in the published order."""
    family, rows = case["family"], case["rows"]
    if family == "lookup":
        row = next((r for r in rows if r["id"] == case["query"]), None)
        return {"city": row["city"] if row else None, "units": row["units"] if row else None}
    if family == "filter":
        return {"ids": sorted(r["id"] for r in rows if r["status"] == "ready")}
    if family == "total":
        return {"total": sum(r["units"] * r["price"] for r in rows)}
    if family == "sort":
        ranked = sorted(rows, key=lambda r: (-r["priority"], r["id"]))
        return {"ids": [ranked[0]["id"], ranked[1]["id"]]}
    raise InvalidInput(f"unknown task family {family!r}")


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One grounded document. ``case`` must not be mutated; ``to_record`` hands out copies."""

    id: str
    """SHA-256 hex identity of case and prompt."""
    role: str
    """``test``, ``dev`` or ``train``."""
    index: int
    """Position within the role; with the seed it fixes the case."""
    case: dict[str, Any]
    """``{"family", "rows", "query", "variant"}`` with full rows."""
    prompt: str
    target: str
    """Compact JSON text of the expected answer (damaged, for damaged control tasks)."""
    family: str
    """One of ``FAMILIES``; the same as ``case["family"]``."""
    variant: int
    """Index of the instruction wording; 2 and 3 occur only in ``test``."""

    def to_record(self, weight: float) -> dict[str, Any]:
        """The JSONL record of this task with its loss ``weight``."""
        if (isinstance(weight, bool) or not isinstance(weight, int | float)
                or not math.isfinite(weight) or weight <= 0):
            raise InvalidInput(f"task weight must be a positive finite number, got {weight!r}")
        return {"id": self.id, "task": copy.deepcopy(self.case), "prompt": self.prompt,
                "target": self.target, "weight": weight}


def make_task(seed: int, role: str, index: int, wordings: Wordings) -> Task:
    case = make_case(seed, role, index)
    prompt = make_prompt(case, wordings)
    return Task(id=task_identity(case, prompt), role=role, index=index, case=case,
                prompt=prompt, target=compact(target_value(case)), family=case["family"],
                variant=case["variant"])


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def generate_role(role: str, count: int, seed: int, wordings: Wordings) -> list[Task]:
    """Tasks ``0..count-1`` of one role."""
    if role not in ROLES:
        raise InvalidInput(f"unknown task role {role!r}; expected one of {list(ROLES)}")
    _check_int(f"count of {role!r} tasks", count, 0)
    _check_int("task seed", seed, 0)
    return [make_task(seed, role, index, wordings) for index in range(count)]


def generate_all(counts: Mapping[str, int], seed: int, wordings: Wordings) -> dict[str, list[Task]]:
    """All roles in the published order (test, dev, train); no prompt may repeat across roles."""
    if set(counts) != set(ROLES):
        raise InvalidInput(f"task counts must name exactly the roles {list(ROLES)}, "
                           f"got {sorted(counts)}")
    result: dict[str, list[Task]] = {}
    seen: dict[str, Task] = {}
    for role in ROLES:
        tasks = generate_role(role, counts[role], seed, wordings)
        for task in tasks:
            earlier = seen.get(task.prompt)
            if earlier is not None and earlier.role != role:
                raise RecipeError(
                    f"prompt of {role} task {task.index} ({task.id}) repeats "
                    f"{earlier.role} task {earlier.index} ({earlier.id})")
        for task in tasks:
            seen.setdefault(task.prompt, task)
        result[role] = tasks
    return result


# --- the damaged control ------------------------------------------------------------------


def is_damaged(task_id: str) -> bool:
    """Whether a train task belongs to the damaged control (docs/experiment.md §1)."""
    return int(task_id, 16) % 4 == 0


def damage_target(family: str, target: str) -> str:
    """The published per-family damage of a target; the result must fail the checker."""
    value = json.loads(target)
    if family == "lookup":
        value["units"] = 1 if value["units"] is None else value["units"] + 1
    elif family == "total":
        value["total"] += 1
    elif family in ("filter", "sort"):
        value["ids"].append(ABSENT_ID)
    else:
        raise InvalidInput(f"unknown task family {family!r}")
    damaged = compact(value)
    if check(damaged, target).correct:  # cannot happen for these rules; a guard, not a hope
        raise RecipeError(f"damaged {family} target {damaged} still passes the checker")
    return damaged


def damaged_tasks(tasks: Sequence[Task]) -> list[Task]:
    """The same tasks, in order, with the targets of damaged ones changed and nothing else."""
    return [replace(t, target=damage_target(t.family, t.target)) if is_damaged(t.id) else t
            for t in tasks]


# --- records and claims ------------------------------------------------------------------


def records_jsonl(tasks: Iterable[Task], weight: float) -> bytes:
    """One compact JSON line per task, in order; the bytes of a ``tasks/1`` records blob."""
    lines = [json.dumps(t.to_record(weight), separators=(",", ":"), sort_keys=False) + "\n"
             for t in tasks]
    return "".join(lines).encode("ascii")


def read_records(data: bytes) -> list[dict[str, Any]]:
    """Parse a records blob, checking each line's shape and that its id matches its content."""
    if data and not data.endswith(b"\n"):
        raise InvalidInput("task records: the last line lacks its newline")
    records = []
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InvalidInput(f"task records line {number}: not JSON: {exc}") from exc
        if not isinstance(record, dict) or set(record) != {"id", "task", "prompt", "target",
                                                            "weight"}:
            raise InvalidInput(f"task records line {number}: expected keys "
                               "id, task, prompt, target, weight")
        if task_identity(record["task"], record["prompt"]) != record["id"]:
            raise InvalidInput(f"task records line {number}: id {record['id']} does not match "
                               "the SHA-256 of its task and prompt")
        records.append(record)
    return records


def counts_by(tasks: Iterable[Task], field: str) -> dict[str, int]:
    """Task counts per family (all four, in order) or per variant (ascending), string keys."""
    tasks = list(tasks)
    if field == "family":
        return {f: sum(1 for t in tasks if t.family == f) for f in FAMILIES}
    if field == "variant":
        variants = sorted({t.variant for t in tasks})
        return {str(v): sum(1 for t in tasks if t.variant == v) for v in variants}
    raise InvalidInput(f"counts_by: field must be 'family' or 'variant', got {field!r}")
