"""The file layout an export bundle must have, derived from its closure (docs/bundle.md, "Paths").

Written from docs/bundle.md alone: given the records of a target's closure, ``derive`` gives
every path the exporter writes and the object at each, so that a bundle can be required to
be exactly that (``layoutcheck.py``). What a reader loads (a ``models/<arm>/`` folder given
to ``from_pretrained``, the test set beside a report) is then tied to the objects the
records name, and not only to the objects the manifest lists.

Where runs' outputs go depends on the bundle role each recipe declares, and the exporter
applies a role only when the recipe is installed at the version the action records; so a
recipe of the table below either has its role or the generic layout, for all of its runs at
that version. ``derive`` takes that choice as ``roles``; ``role_choices`` lists them.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..records.objects import is_object_id

MODELS, RUNS, OUTPUTS, TASKS, CODE = range(5)
"""Which path an object named from several places takes: the first of these, then bytewise."""
JOURNALS = "training"
SIGNATURES = "signatures"
SNIFF_MAX = 16 << 20
MAX_SEGMENT = 255
WEIGHT_SUFFIX = ".safetensors"
_SEGMENT = re.compile(r"[A-Za-z0-9._@+=,-]+")
_UNCLEAN = re.compile(r"[^A-Za-z0-9._@+=,-]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class Role:
    """A recipe's bundle role (docs/bundle.md, "Bundle roles")."""

    folder: str
    arm_input: str | None = None
    arm_output: str | None = None
    role_input: str | None = None
    plain_role: str | None = None


ROLES: Mapping[str, Role] = {
    "evaluate": Role(folder="evaluations", arm_input="model", role_input="tasks",
                     plain_role="test"),
    "train": Role(folder="training", arm_output="checkpoint"),
    "serve": Role(folder="serving"),
    "report": Role(folder="report"),
}
"""What the recipes of this repository declare (the table of docs/bundle.md)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClosureView:
    """The closure as the layout needs it: every object's kind, each record's value, and a
    reader of blob bytes (an output's file suffix comes from its bytes)."""

    kinds: Mapping[str, str | None]
    """Kind of every object of the closure (and its signatures); None for a blob."""
    records: Mapping[str, Mapping[str, Any]]
    sizes: Mapping[str, int]
    read: Callable[[str], bytes | None]
    """The verified bytes of a blob, or None when they cannot be had."""

    def of_kind(self, kind: str) -> list[str]:
        return sorted(d for d, k in self.kinds.items() if k == kind and d in self.records)

    def link(self, value: Any, kind: str | None = None) -> str | None:
        if not is_object_id(value) or value not in self.kinds:
            return None
        return value if kind is None or self.kinds[value] == kind else None

    def action(self, receipt: str) -> Mapping[str, Any]:
        action = self.records.get(self.records[receipt].get("action", ""))
        return action if action is not None else {}


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """Every path of every object: its first path, then (format 2) its copies."""

    paths: Mapping[str, tuple[str, ...]]
    models: Mapping[str, str]
    """Each checkpoint's folder name: its files are in ``models/<name>/``."""
    weight_only: frozenset[str]
    """Blobs every link names as weights: what ``--no-weights`` leaves out."""
    tensors: frozenset[str]
    """Tensor data of params/1 records: the objects a bundle may hold as byte ranges."""

    def files(self, *, exported: set[str], copies: bool) -> dict[str, str]:
        """Path -> object of every object file for the objects ``exported`` as files."""
        out: dict[str, str] = {}
        for oid in sorted(exported):
            where = self.paths.get(oid, ())
            for path in where if copies else where[:1]:
                out[path] = oid
        return out


def short(oid: str) -> str:
    return oid[7:19]


def clean(name: str) -> str | None:
    """A name as one path segment of ``[A-Za-z0-9._@+=,-]``: other runs of characters become
    ``-``, leading and trailing ``.``/``-`` go, at most 100 characters; None if nothing is left."""
    text = _UNCLEAN.sub("-", name).strip(".-")[:100]
    return text or None


def tree_path_kept(path: str) -> bool:
    """A tree entry keeps its path in a bundle iff every segment is already a clean name of
    at most 255 characters."""
    parts = path.split("/")
    return all(_SEGMENT.fullmatch(p) and p not in (".", "..") and len(p) <= MAX_SEGMENT
               for p in parts)


def unique(wanted: Mapping[str, str], fallback: Callable[[str], str]) -> dict[str, str]:
    """The wanted names; a name (case-folded) that several objects want gives way to their
    fallbacks."""
    count = Counter(name.casefold() for name in wanted.values())
    return {d: name if count[name.casefold()] == 1 else fallback(d) for d, name in wanted.items()}


def suffix(data: bytes | None, size: int, name: str) -> str:
    """An output blob's extension from its bytes (docs/bundle.md, "Paths")."""
    if "." in name or size == 0 or size > SNIFF_MAX or data is None:
        return ""
    head = data[:4096].lstrip().lower()
    for magic, ext in ((b"\x89png\r\n\x1a\n", ".png"), (b"%pdf-", ".pdf"), (b"<svg", ".svg"),
                       (b"<!doctype html", ".html"), (b"<html", ".html")):
        if head.startswith(magic):
            return ext
    if head.startswith(b"<?xml") and b"<svg" in head:
        return ".svg"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    try:
        for line in text.splitlines():
            if line.strip():
                json.loads(line)
        return ".jsonl"
    except ValueError:
        pass
    try:
        json.loads(text)
        return ".json"
    except ValueError:
        return ".txt"


def role_choices(c: ClosureView) -> Iterator[dict[str, Role | None]]:
    """Each assignment of roles to the recipe references (``name@version``) of the closure's
    receipts: the declared role for all first, then every combination with some generic."""
    refs = sorted({str(c.action(r).get("recipe", "")) for r in c.of_kind("receipt/1")})
    known = [ref for ref in refs if ref.partition("@")[0] in ROLES]
    for off in itertools.chain.from_iterable(
            itertools.combinations(known, n) for n in range(len(known) + 1)):
        yield {ref: None if ref in off or ref not in known else ROLES[ref.partition("@")[0]]
               for ref in refs}


def derive(c: ClosureView, roles: Mapping[str, Role | None]) -> Layout:
    """The paths of every object of the closure under one choice of ``roles``."""
    receipt_roles = {r: roles.get(str(c.action(r).get("recipe", ""))) for r in c.of_kind("receipt/1")}
    weight_only, tensors = _weight_only(c)
    named: dict[str, list[str]] = defaultdict(list)
    for cid in c.of_kind("commitment/1"):
        for name, value in _items(c.records[cid].get("subjects")):
            if (oid := c.link(value)) is not None and (name_ := clean(name)):
                named[oid].append(name_)
    models = _model_dirs(c, named)
    return Layout(paths=_paths(c, receipt_roles, named, models), models=models,
                  weight_only=weight_only, tensors=tensors)


def _paths(c: ClosureView, roles: Mapping[str, Role | None], named: Mapping[str, list[str]],
           models: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    recs = c.records
    cited: dict[str, list[str]] = defaultdict(list)
    for a in c.of_kind("action/1"):
        for name, value in _items(recs[a].get("inputs")):
            if (r := c.link(value, "receipt/1")) is not None and (name_ := clean(name)):
                cited[r].append(name_)
    recipe = {r: str(c.action(r).get("recipe", "")).partition("@")[0]
              for r in c.of_kind("receipt/1")}
    plain = {r: f"{recipe[r]}-{short(r)}" for r in recipe}
    label = unique({r: min(cited[r], default=plain[r]) for r in recipe}, plain.__getitem__)
    proposals: dict[str, list[tuple[tuple[int, str], str]]] = defaultdict(list)

    def propose(oid: str | None, priority: tuple[int, str], path: str) -> None:
        if oid is not None and c.kinds[oid] is None:
            proposals[oid].append((priority, path))

    def propose_tree(tree: str | None, priority: tuple[int, str], prefix: str) -> None:
        if tree is not None and c.kinds[tree] == "tree/1" and tree in recs:
            for name, entry in _items(recs[tree].get("entries")):
                if tree_path_kept(name) and isinstance(entry, dict):
                    propose(c.link(entry.get("id")), priority, f"{prefix}/{name}")

    def propose_outputs(r: str, priority: tuple[int, str], prefix: str) -> None:
        for name, value in _items(recs[r].get("outputs")):
            if (oid := c.link(value)) is None or (name_ := clean(name)) is None:
                continue
            if c.kinds[oid] is None:
                size = c.sizes.get(oid, 0)
                data = c.read(oid) if 0 < size <= SNIFF_MAX and "." not in name_ else None
                propose(oid, priority, f"{prefix}/{name_}{suffix(data, size, name_)}")
            propose_tree(oid, priority, f"{prefix}/{name_}")

    for ck, directory in models.items():
        propose_tree(c.link(recs[ck].get("files"), "tree/1"), (MODELS, ""), f"models/{directory}")
        propose_tree(c.link(recs[ck].get("state"), "tree/1"), (MODELS, ""), f"states/{directory}")
    for r, directory in _run_dirs(c, roles, models, label).items():
        priority = (RUNS, directory.partition("/")[0])
        for j in recs[r].get("journals") or []:
            if (journal := c.link(j, "journal/1")) is not None and journal in recs:
                propose(c.link(recs[journal].get("entries")), priority,
                        f"{directory}/rank-{recs[journal].get('rank')}.journal.jsonl")
        if roles[r] is not None:
            propose_outputs(r, priority, directory)
    for r in recipe:
        if roles[r] is None:
            propose_outputs(r, (OUTPUTS, ""), f"outputs/{label[r]}")
    tasks = {t: min(named.get(t, ()), default=clean(str(recs[t].get("role", ""))) or "tasks")
             for t in c.of_kind("tasks/1")}
    for t, name in unique(tasks, lambda t: f"{tasks[t]}-{short(t)}").items():
        propose(c.link(recs[t].get("records")), (TASKS, ""), f"tasks/{name}.jsonl")
    code: dict[str, str] = {}
    for a in c.of_kind("action/1"):
        if (tree := c.link(recs[a].get("code"), "tree/1")) is not None:
            code[tree] = min(code.get(tree, "~"), clean(str(recs[a].get("recipe", ""))) or "recipe")
    for tree, name in unique(code, lambda t: f"{code[t]}-{short(t)}").items():
        propose_tree(tree, (CODE, ""), f"code/{name}")
    return _settle(c, proposals, label)


def _items(value: Any) -> list[tuple[str, Any]]:
    return list(value.items()) if isinstance(value, dict) else []


def _model_dirs(c: ClosureView, named: Mapping[str, list[str]]) -> dict[str, str]:
    recs = c.records
    checkpoints = c.of_kind("checkpoint/1")
    wanted = {ck: min(named[ck]) for ck in checkpoints if named.get(ck)}
    for ck in sorted(wanted, key=lambda d: (wanted[d], d)):
        parent = c.link(recs[ck].get("parent"), "checkpoint/1")
        while parent is not None and parent not in wanted and parent in recs:
            wanted[parent] = f"{wanted[ck]}-step-{recs[parent].get('step')}"
            parent = c.link(recs[parent].get("parent"), "checkpoint/1")
    for ck in checkpoints:
        wanted.setdefault(ck, short(ck))
    return unique(wanted, short)


def _output_arm(c: ClosureView, r: str, first: str | None,
                models: Mapping[str, str]) -> str | None:
    outputs = c.records[r].get("outputs")
    outputs = outputs if isinstance(outputs, dict) else {}
    for name in sorted(outputs, key=lambda n: (n != first, n)):
        if (ck := c.link(outputs[name], "checkpoint/1")) is not None and ck in models:
            return models[ck]
    return None


def _run_name(c: ClosureView, r: str, role: Role, models: Mapping[str, str],
              label: Mapping[str, str]) -> str | None:
    inputs = c.action(r).get("inputs")
    inputs = inputs if isinstance(inputs, dict) else {}
    base: str | None = None
    if role.arm_input is not None:
        model = c.link(inputs.get(role.arm_input), "checkpoint/1")
        base = models[model] if model is not None and model in models else label[r]
    elif role.arm_output is not None:
        base = _output_arm(c, r, role.arm_output, models) or label[r]
    if role.role_input is not None:
        tasks = c.link(inputs.get(role.role_input), "tasks/1")
        name = (clean(str(c.records[tasks].get("role", "")))
                if tasks is not None and tasks in c.records else None)
        if name is not None and name != role.plain_role:
            return f"{base or label[r]}-{name}"
    return base


def _run_dirs(c: ClosureView, roles: Mapping[str, Role | None], models: Mapping[str, str],
              label: Mapping[str, str]) -> dict[str, str]:
    folders: dict[str, dict[str, str | None]] = defaultdict(dict)
    for r, role in roles.items():
        if role is not None:
            folders[role.folder][r] = _run_name(c, r, role, models, label)
        elif c.records[r].get("journals"):
            folders[JOURNALS][r] = _output_arm(c, r, None, models) or label[r]
    dirs: dict[str, str] = {}
    for folder, runs in folders.items():
        if len(runs) == 1 and None in runs.values():
            dirs[next(iter(runs))] = folder
            continue
        names = {r: name or label[r] for r, name in runs.items()}

        def fallback(r: str, n: Mapping[str, str] = names) -> str:
            return f"{n[r]}-{short(r)}"

        for r, name in unique(names, fallback).items():
            dirs[r] = f"{folder}/{name}"
    return dirs


def _settle(c: ClosureView, proposals: Mapping[str, list[tuple[tuple[int, str], str]]],
            label: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Best proposals (a model file: in every checkpoint folder), receipts by label,
    signatures by ID, less every path another object wants (case-folded) or that is another
    path's folder; what is left without a path goes to ``records/`` or ``blobs/`` by ID."""
    def by_id(d: str) -> str:
        return f"records/{d[7:]}.json" if c.kinds[d] is not None else f"blobs/{d[7:]}"

    wanted = {d: [path for priority, path in sorted(set(p)) if priority == min(p)[0]
                  and (priority[0] == MODELS or path == min(p)[1])]
              for d, p in proposals.items()}
    wanted.update({r: [f"receipts/{name}.json"] for r, name in label.items()})
    wanted.update({d: [f"{SIGNATURES}/{d[7:]}.json"] for d, k in c.kinds.items()
                   if k == "signature/1"})
    every = [p for paths in wanted.values() for p in paths]
    count = Counter(p.casefold() for p in every)
    dirs = {p.casefold().rsplit("/", i)[0] for p in every for i in range(1, p.count("/") + 1)}
    kept = {d: tuple(p for p in paths if count[p.casefold()] == 1 and p.casefold() not in dirs)
            for d, paths in wanted.items()}
    return {d: kept.get(d) or (by_id(d),) for d in c.kinds}


def _links(value: Any) -> Iterator[str]:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if is_object_id(item):
                yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _weight_only(c: ClosureView) -> tuple[frozenset[str], frozenset[str]]:
    recs = c.records
    links = Counter(d for rec in recs.values() for d in _links(rec))
    as_weight: Counter[str] = Counter()
    tensors: set[str] = set()
    for p in c.of_kind("params/1"):
        for t in (recs[p].get("tensors") or {}).values():
            if isinstance(t, dict) and is_object_id(t.get("data")):
                as_weight[t["data"]] += 1
                tensors.add(t["data"])
    trees = {d for ck in c.of_kind("checkpoint/1") for member in ("files", "state")
             if (d := c.link(recs[ck].get(member), "tree/1")) is not None and d in recs}
    for tree in trees:
        for name, entry in _items(recs[tree].get("entries")):
            if name.endswith(WEIGHT_SUFFIX) and isinstance(entry, dict) \
                    and is_object_id(entry.get("id")):
                as_weight[entry["id"]] += 1
    only = frozenset(d for d, n in as_weight.items()
                     if n == links[d] and c.kinds.get(d, None) is None)
    return only, frozenset(tensors)
