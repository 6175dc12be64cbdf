"""Action records and the receipts that answer them: an action's ID (computed, or stored),
the cache lookup, and why a step missed the cache (docs/format.md §6.2-§6.3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nscas.objects import canonical
from nscas.objects.digests import Digest, sha256_hex
from nscas.runs.changes import CacheMiss, difference
from nscas.runs.codetree import recipe_files
from nscas.runs.config import params_to_json
from nscas.runs.recipe import Recipe
from nscas.store.protocol import tree_record
from nscas.store.reading import ObjectInfo
from nscas.store.writer import Store


def code_id(recipe: Recipe) -> Digest:
    """The ID ``code_tree`` gives the recipe's code, computed without storing anything."""
    files = {name: path.read_bytes() for name, path in recipe_files(recipe).items()}
    hashed = _Hashed({Digest.of(data): data for data in files.values()})
    tree = tree_record(hashed, {name: Digest.of(data) for name, data in files.items()})
    return Digest.of(canonical.encode(tree))


class _Hashed:
    """Bytes not (yet) stored, answering what ``tree_record`` asks of a store about them."""

    def __init__(self, blobs: Mapping[Digest, bytes]) -> None:
        self._blobs = blobs

    def info(self, oid: Digest) -> ObjectInfo:
        data = self._blobs[oid]
        return ObjectInfo(id=oid, size=len(data), sha256=sha256_hex(data), kind=None,
                          storage="inline", codec="raw", stored_size=len(data), created=0.0)

    def sha256(self, oid: Digest) -> str:
        return sha256_hex(self._blobs[oid])


def action_record(recipe: Recipe, code: Digest, inputs: Mapping[str, Digest], params: Any) -> dict[str, Any]:
    """The action/1 record of a step: the one place it is built."""
    return {"nscas": "action/1", "recipe": f"{recipe.name}@{recipe.version}", "code": str(code),
            "inputs": {k: str(v) for k, v in sorted(inputs.items())},
            "params": params_to_json(params)}


def action_id(recipe: Recipe, code: Digest, inputs: Mapping[str, Digest], params: Any) -> Digest:
    """The ID the step's action record has, computed without storing it."""
    return Digest.of(canonical.encode(action_record(recipe, code, inputs, params)))



def find_receipt(store: Store, action: Digest) -> Digest | None:
    """The earliest succeeded receipt of ``action``, if any (the cache)."""
    found = [(rec["started"], oid) for oid, rec in _receipts(store, action)]
    return min(found)[1] if found else None


def explain_miss(store: Store, action: Digest, refs: tuple[tuple[str, str], ...],
                 expected: Mapping[str, Digest | None]) -> CacheMiss:
    """Compare a new action with the one of the step's last succeeded run, for a step that
    has no previous run by name (§6.3).

    That run is the newest succeeded receipt of the same recipe that ran on the same inputs
    and params (so only the code or version differ), or else, among those that set one of the
    step's output ``refs`` to its value at start (``expected``), the newest.
    """
    new = store.get_record(action)
    last = _last_run(store, new, refs, expected)
    if last is None:
        return CacheMiss(previous=None)
    receipt, old = last
    return difference(store, receipt, old, new)


def _last_run(store: Store, new: Mapping[str, Any], refs: tuple[tuple[str, str], ...],
              expected: Mapping[str, Digest | None]) -> tuple[Digest, dict[str, Any]] | None:
    name = _recipe_name(new["recipe"])
    same: list[tuple[str, Digest, dict[str, Any]]] = []
    if new["inputs"]:
        first = min(new["inputs"])
        for link in store.links_to(Digest.parse(new["inputs"][first])):
            rec = store.get_record(link.parent)
            if (rec.get("nscas") == "action/1" and _recipe_name(rec["recipe"]) == name
                    and rec["inputs"] == new["inputs"] and rec["params"] == new["params"]):
                same += [(r["finished"], oid, rec) for oid, r in _receipts(store, link.parent)]
    if same:
        _, receipt, rec = max(same, key=lambda c: (c[0], c[1]))
        return receipt, rec
    setters: list[tuple[str, Digest, dict[str, Any]]] = []
    for output, ref in refs:
        target = expected.get(ref)
        if target is None:
            continue
        for link in store.links_to(target):
            rec = store.get_record(link.parent)
            if (rec.get("nscas") == "receipt/1" and rec.get("status") == "succeeded"
                    and rec["outputs"].get(output) == str(target)):
                act = store.get_record(Digest.parse(rec["action"]))
                if _recipe_name(act["recipe"]) == name:
                    setters.append((rec["finished"], link.parent, act))
    if setters:
        _, receipt, rec = max(setters, key=lambda c: (c[0], c[1]))
        return receipt, rec
    return None


def _receipts(store: Store, action: Digest) -> list[tuple[Digest, dict[str, Any]]]:
    """The succeeded receipts of ``action``."""
    out = []
    for link in store.links_to(action):
        rec = store.get_record(link.parent)
        if (link.path == "$.action" and rec.get("nscas") == "receipt/1"
                and rec.get("status") == "succeeded"):
            out.append((link.parent, rec))
    return out


def _recipe_name(recipe: str) -> str:
    return recipe.rpartition("@")[0]
