"""Where each object of a closure goes in a bundle: paths that are a function of the closure's
own records and of the bundle roles its recipes declare, never of the rest of the store, so one
target always gives the same files (docs/bundle.md "Layout")."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nscas.bundle.format import SIGNATURES, Range
from nscas.errors import InvalidInput
from nscas.models.checkpoints import read_header
from nscas.objects import canonical
from nscas.objects.digests import Digest, is_digest_text
from nscas.objects.kinds import is_safe_relpath
from nscas.runs.recipe import BundleRole, Recipe
from nscas.store.provenance import SIGNATURE, signatures_of

if TYPE_CHECKING:
    from nscas.store.reading import ObjectInfo, StoreReader

_SNIFF_MAX = 16 << 20  # output blobs up to this size are read to give their file a suffix
_SEGMENT = re.compile(r"[A-Za-z0-9._@+=,-]+")
_MAX_SEGMENT = 255  # NAME_MAX of Linux and most file systems
# When several roles name one object, it takes the path of the first role in this order
# (runs' folders among themselves by folder name).
_MODELS, _RUNS, _OUTPUTS, _TASKS, _CODE = range(5)
_JOURNALS = "training"  # the folder of journals of runs whose recipe declares no bundle role

RecipeLookup = Callable[[str], Recipe | None]
"""The recipe registered under a name, or None (``registered_recipe``; tests pass their own)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Closure:
    target: Digest
    infos: Mapping[Digest, ObjectInfo]
    records: Mapping[Digest, dict[str, Any]]

    def of_kind(self, kind: str) -> list[Digest]:
        return sorted(d for d, r in self.records.items() if r["nscas"] == kind)

    def link(self, value: Any, kind: str | None = None) -> Digest | None:
        """The object ``value`` names, if it is one of the closure (and of ``kind``)."""
        if not is_digest_text(value):
            return None
        oid = Digest.parse(value)
        if oid not in self.infos or (kind is not None and self.infos[oid].kind != kind):
            return None
        return oid

    def action(self, receipt: Digest) -> dict[str, Any]:
        return self.records[Digest.parse(self.records[receipt]["action"])]


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    files: Mapping[str, Digest]
    """Every object file; with format 2 a model file may be at several paths."""
    derived: Mapping[Digest, Range]
    omitted: frozenset[Digest]


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """What a bundle of a closure holds, before ``--no-weights`` picks what is written."""

    closure: Closure
    paths: Mapping[Digest, str]
    """The one path of each object (format 1), its first path (format 2)."""
    copies: Mapping[Digest, tuple[str, ...]]
    """Its other paths in format 2: the same file in the folder of every checkpoint that has
    it (a config.json that two checkpoints share)."""
    weight_only: frozenset[Digest]
    """Objects linked only as weights: checkpoints' safetensors files and tensor blobs."""
    tensors: frozenset[Digest]
    ranges: Mapping[Digest, tuple[Range, ...]]
    """Where each tensor lies in a checkpoint's weight file."""

    def plan(self, *, weights: bool, copies: bool = True) -> Plan:
        exported = {d for d in self.closure.infos if weights or d not in self.weight_only}
        derived: dict[Digest, Range] = {}
        for t in sorted(self.tensors & self.weight_only):
            options = sorted((self.paths[r.source], r) for r in self.ranges.get(t, ())
                             if r.source in exported and r.source not in self.tensors)
            if options:
                derived[t] = options[0][1]
        files = {self.paths[d]: d for d in exported if d not in derived}
        if copies:
            files.update({p: d for d in files.values() for p in self.copies.get(d, ())})
        omitted = frozenset(self.closure.infos.keys() - set(files.values()) - derived.keys())
        return Plan(files=files, derived=derived, omitted=omitted)


def layout(store: StoreReader, target: Digest, recipes: RecipeLookup) -> Layout:
    """Where each object of the closure of ``target`` goes; ``recipes`` finds the bundle roles."""
    ids = sorted(store.closure([target]))
    infos = {d: store.info(d) for d in ids}
    records = {d: store.get_record(d) for d in ids if infos[d].kind is not None}
    # Signatures link their receipt, so no receipt reaches them: every signature of every
    # receipt of the closure comes along (docs/bundle.md "Signatures").
    for sig in signatures_of(store, [d for d, i in infos.items() if i.kind == "receipt/1"]):
        if sig not in infos:
            infos[sig] = store.info(sig)
            records[sig] = store.get_record(sig)
    c = Closure(target=target, infos=infos, records=records)
    weight_only, tensors = _weight_only(c)
    paths = _paths(store, c, _roles(c, recipes))
    return Layout(closure=c, paths={d: p[0] for d, p in paths.items()},
                   copies={d: p[1:] for d, p in paths.items() if len(p) > 1},
                   weight_only=weight_only, tensors=tensors, ranges=_tensor_ranges(store, c))


def _roles(c: Closure, recipes: RecipeLookup) -> dict[Digest, BundleRole | None]:
    """The bundle role of each receipt's run: the one its recipe declares, if the recipe the
    action names (``name@version``) is registered here with that very version."""
    declared: dict[str, BundleRole | None] = {}
    for r in c.of_kind("receipt/1"):
        name, _, version = (ref := c.action(r)["recipe"]).partition("@")
        if ref not in declared:
            recipe = recipes(name)
            declared[ref] = recipe.bundle if recipe is not None and recipe.version == version \
                else None
    return {r: declared[c.action(r)["recipe"]] for r in c.of_kind("receipt/1")}


def _clean(name: str) -> str | None:
    """A name as one safe path segment (letters, digits and ``._@+=,-``), or None."""
    text = re.sub(r"[^A-Za-z0-9._@+=,-]+", "-", name).strip(".-")[:100]
    return text or None


def _bundle_tree_path(path: str) -> bool:
    """A tree entry keeps its path in the bundle iff the path is safe and every part is
    already a clean name of at most 255 characters, what a file system holds (docs/bundle.md
    "Paths"); otherwise the file goes to ``blobs/``."""
    return is_safe_relpath(path) and all(_SEGMENT.fullmatch(p) and len(p) <= _MAX_SEGMENT
                                         for p in path.split("/"))


def _unique(wanted: Mapping[Digest, str], fallback: Callable[[Digest], str]) -> dict[Digest, str]:
    """The ``wanted`` names, but a name several objects want gives way to their fallbacks."""
    count = Counter(name.casefold() for name in wanted.values())
    return {d: name if count[name.casefold()] == 1 else fallback(d) for d, name in wanted.items()}


def _suffix(store: StoreReader, oid: Digest, size: int, name: str) -> str:
    """A file suffix for an output blob, judged from its bytes (``.jsonl``, ``.svg`` ...)."""
    if "." in name or size == 0 or size > _SNIFF_MAX:
        return ""
    data = store.get_bytes(oid)
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
    for ext, parse in ((".jsonl", lambda: [json.loads(x) for x in text.splitlines() if x.strip()]),
                       (".json", lambda: json.loads(text))):
        try:
            parse()
            return ext
        except ValueError:
            continue
    return ".txt"


def _paths(store: StoreReader, c: Closure,
           roles: Mapping[Digest, BundleRole | None]) -> dict[Digest, tuple[str, ...]]:
    """The paths of every object of the closure, its first path first (docs/bundle.md,
    "Paths"): one path, or a model file's path in each checkpoint folder that holds it."""
    recs = c.records
    named: dict[Digest, list[str]] = defaultdict(list)  # what commitments call their subjects
    for cid in c.of_kind("commitment/1"):
        for name, value in recs[cid]["subjects"].items():
            if (oid := c.link(value)) is not None and (clean := _clean(name)):
                named[oid].append(clean)
    cited: dict[Digest, list[str]] = defaultdict(list)  # what actions call the receipts they take
    for a in c.of_kind("action/1"):
        for name, value in recs[a]["inputs"].items():
            if (r := c.link(value, "receipt/1")) is not None and (clean := _clean(name)):
                cited[r].append(clean)
    recipe = {r: c.action(r)["recipe"].partition("@")[0] for r in c.of_kind("receipt/1")}
    plain = {r: f"{recipe[r]}-{r.short}" for r in recipe}
    label = _unique({r: min(cited[r], default=plain[r]) for r in recipe}, plain.__getitem__)
    models = _model_dirs(c, named)
    proposals: dict[Digest, list[tuple[tuple[int, str], str]]] = defaultdict(list)

    def propose(oid: Digest | None, priority: tuple[int, str], path: str) -> None:
        if oid is not None and c.infos[oid].kind is None:  # records keep records/, receipts/
            proposals[oid].append((priority, path))

    def propose_tree(tree: Digest | None, priority: tuple[int, str], prefix: str) -> None:
        if tree is not None and c.infos[tree].kind == "tree/1":
            for name, entry in recs[tree]["entries"].items():
                if _bundle_tree_path(name):
                    propose(c.link(entry["id"]), priority, f"{prefix}/{name}")

    def propose_outputs(r: Digest, priority: tuple[int, str], prefix: str) -> None:
        for name, value in recs[r]["outputs"].items():
            if (oid := c.link(value)) is None or (clean := _clean(name)) is None:
                continue
            if c.infos[oid].kind is None:
                ext = _suffix(store, oid, c.infos[oid].size, clean)
                propose(oid, priority, f"{prefix}/{clean}{ext}")
            propose_tree(oid, priority, f"{prefix}/{clean}")

    for ck, directory in models.items():
        propose_tree(c.link(recs[ck]["files"], "tree/1"), (_MODELS, ""), f"models/{directory}")
        propose_tree(c.link(recs[ck].get("state"), "tree/1"), (_MODELS, ""),
                     f"states/{directory}")
    for r, directory in _run_dirs(c, roles, models, label).items():
        priority = (_RUNS, directory.partition("/")[0])
        for j in recs[r]["journals"]:
            if (journal := c.link(j, "journal/1")) is not None:
                propose(c.link(recs[journal]["entries"]), priority,
                        f"{directory}/rank-{recs[journal]['rank']}.journal.jsonl")
        if roles[r] is not None:
            propose_outputs(r, priority, directory)
    for r in recipe:
        if roles[r] is None:
            propose_outputs(r, (_OUTPUTS, ""), f"outputs/{label[r]}")
    tasks = {t: min(named[t], default=_clean(recs[t]["role"]) or "tasks")
             for t in c.of_kind("tasks/1")}
    for t, name in _unique(tasks, lambda t: f"{tasks[t]}-{t.short}").items():
        propose(c.link(recs[t]["records"]), (_TASKS, ""), f"tasks/{name}.jsonl")
    code: dict[Digest, str] = {}
    for a in c.of_kind("action/1"):
        if (tree := c.link(recs[a]["code"], "tree/1")) is not None:
            code[tree] = min(code.get(tree, "~"), _clean(recs[a]["recipe"]) or "recipe")
    for tree, name in _unique(code, lambda t: f"{code[t]}-{t.short}").items():
        propose_tree(tree, (_CODE, ""), f"code/{name}")
    return _settle(c, proposals, label)


def _model_dirs(c: Closure, named: Mapping[Digest, list[str]]) -> dict[Digest, str]:
    """Checkpoint directories: the arm a commitment names a checkpoint by, ``<arm>-step-<n>``
    for its unnamed ancestors, else its short ID."""
    recs = c.records
    checkpoints = c.of_kind("checkpoint/1")
    wanted = {ck: min(named[ck]) for ck in checkpoints if named.get(ck)}
    for ck in sorted(wanted, key=lambda d: (wanted[d], d)):
        parent = c.link(recs[ck]["parent"], "checkpoint/1")
        while parent is not None and parent not in wanted:
            wanted[parent] = f"{wanted[ck]}-step-{recs[parent]['step']}"
            parent = c.link(recs[parent]["parent"], "checkpoint/1")
    for ck in checkpoints:
        wanted.setdefault(ck, ck.short)
    return _unique(wanted, lambda d: d.short)


def _run_dirs(c: Closure, roles: Mapping[Digest, BundleRole | None],
              models: Mapping[Digest, str], label: Mapping[Digest, str]) -> dict[Digest, str]:
    """The directory of each run with a bundle role (its outputs and journals), and of each
    run without one that has journals (``training/``, for those only)."""
    folders: dict[str, dict[Digest, str | None]] = defaultdict(dict)
    for r, role in roles.items():
        if role is not None:
            folders[role.folder][r] = _run_name(c, r, role, models, label)
        elif c.records[r]["journals"]:
            folders[_JOURNALS][r] = _output_arm(c, r, None, models) or label[r]
    dirs: dict[Digest, str] = {}
    for folder, runs in folders.items():
        if len(runs) == 1 and None in runs.values():  # the only run of its folder, and no arm
            dirs[next(iter(runs))] = folder
            continue
        names = {r: name or label[r] for r, name in runs.items()}

        def fallback(r: Digest, n: Mapping[Digest, str] = names) -> str:
            return f"{n[r]}-{r.short}"

        for r, name in _unique(names, fallback).items():
            dirs[r] = f"{folder}/{name}"
    return dirs


def _run_name(c: Closure, r: Digest, role: BundleRole, models: Mapping[Digest, str],
              label: Mapping[Digest, str]) -> str | None:
    """A run's directory name in its folder (``BundleRole``), None if it names no arm."""
    inputs = c.action(r)["inputs"]
    base: str | None = None
    if role.arm_input is not None:
        model = c.link(inputs.get(role.arm_input), "checkpoint/1")
        base = models[model] if model is not None else label[r]
    elif role.arm_output is not None:
        base = _output_arm(c, r, role.arm_output, models) or label[r]
    if role.role_input is not None:
        tasks = c.link(inputs.get(role.role_input), "tasks/1")
        name = _clean(c.records[tasks]["role"]) if tasks is not None else None
        if name is not None and name != role.plain_role:
            return f"{base or label[r]}-{name}"
    return base


def _output_arm(c: Closure, r: Digest, first: str | None,
                models: Mapping[Digest, str]) -> str | None:
    """The directory of the checkpoint a run produced (output ``first`` first, then by name)."""
    outputs = c.records[r]["outputs"]
    for name in sorted(outputs, key=lambda n: (n != first, n)):
        if (ck := c.link(outputs[name], "checkpoint/1")) is not None:
            return models[ck]
    return None


def _settle(c: Closure, proposals: Mapping[Digest, list[tuple[tuple[int, str], str]]],
            label: Mapping[Digest, str]) -> dict[Digest, tuple[str, ...]]:
    """The paths of each object: its best proposal and, for a model file, its paths in the
    other checkpoint folders too, less every path that another object wants (or a directory
    of that name, or the same path in another case); receipts by label; the rest, and
    objects left with no path, by ID. The first path is the best one that remains."""
    def by_id(d: Digest) -> str:
        return f"records/{d.hex}.json" if c.infos[d].kind is not None else f"blobs/{d.hex}"

    wanted = {d: [path for priority, path in sorted(set(p)) if priority == min(p)[0]
                  and (priority[0] == _MODELS or path == min(p)[1])]
              for d, p in proposals.items()}
    wanted.update({r: [f"receipts/{name}.json"] for r, name in label.items()})
    wanted.update({d: [f"{SIGNATURES}/{d.hex}.json"] for d, i in c.infos.items()
                   if i.kind == SIGNATURE})
    every = [p for paths in wanted.values() for p in paths]
    count = Counter(p.casefold() for p in every)
    dirs = {p.casefold().rsplit("/", i)[0] for p in every for i in range(1, p.count("/") + 1)}
    kept = {d: tuple(p for p in paths if count[p.casefold()] == 1 and p.casefold() not in dirs)
            for d, paths in wanted.items()}
    return {d: kept.get(d) or (by_id(d),) for d in c.infos}


def _weight_only(c: Closure) -> tuple[frozenset[Digest], frozenset[Digest]]:
    """(objects every link names as weights, tensors): what ``--no-weights`` leaves out."""
    recs = c.records
    links = Counter(d for rec in recs.values() for _, d in canonical.iter_links(rec))
    as_weight: Counter[Digest] = Counter()
    tensors: set[Digest] = set()
    for p in c.of_kind("params/1"):
        for t in recs[p]["tensors"].values():
            as_weight[Digest.parse(t["data"])] += 1
            tensors.add(Digest.parse(t["data"]))
    # A checkpoint's published optimizer state (its ``state`` tree) goes with its weights.
    trees = {d for ck in c.of_kind("checkpoint/1") for member in ("files", "state")
             if (d := c.link(recs[ck].get(member), "tree/1")) is not None}
    for tree in trees:
        for name, entry in recs[tree]["entries"].items():
            if name.endswith(".safetensors"):
                as_weight[Digest.parse(entry["id"])] += 1
    only = frozenset(d for d, n in as_weight.items() if n == links[d] and c.infos[d].kind is None)
    return only, frozenset(tensors)


def _tensor_ranges(store: StoreReader, c: Closure) -> dict[Digest, tuple[Range, ...]]:
    """Where each tensor of a checkpoint's params/1 lies in that checkpoint's weight files,
    from the safetensors headers (the bytes are re-hashed when the file is written)."""
    recs = c.records
    ranges: dict[Digest, set[Range]] = defaultdict(set)
    headers: dict[Digest, tuple[int, dict[str, Any]] | None] = {}
    for ck in c.of_kind("checkpoint/1"):
        tree, params = c.link(recs[ck]["files"], "tree/1"), c.link(recs[ck]["params"], "params/1")
        if tree is None or params is None:
            continue
        for name, entry in sorted(recs[tree]["entries"].items()):
            f = Digest.parse(entry["id"])
            if not name.endswith(".safetensors") or c.infos[f].kind is not None:
                continue
            if f not in headers:
                try:
                    headers[f] = read_header(store, f)
                except InvalidInput:  # not safetensors after all: its tensors stay files
                    headers[f] = None
            if (found := headers[f]) is None:
                continue
            base, header = found
            for tensor_name, t in recs[params]["tensors"].items():
                tid = Digest.parse(t["data"])
                span = _span(header.get(tensor_name))
                if span is not None and span[1] - span[0] == c.infos[tid].size \
                        and base + span[1] <= c.infos[f].size:
                    ranges[tid].add(Range(source=f, offset=base + span[0], size=span[1] - span[0]))
    return {t: tuple(sorted(r)) for t, r in ranges.items()}


def _span(info: Any) -> tuple[int, int] | None:
    offsets = info.get("data_offsets") if isinstance(info, dict) else None
    if (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        return offsets[0], offsets[1]
    return None
