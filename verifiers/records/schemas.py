"""Schemas of the ten v1 record kinds (docs/format.md §3), checked independently of the store.

Members a kind requires are checked with their types; members beyond them are allowed
(receipts carry ``status``, ``error``, ``sha256_stream``, ...) except where docs/format.md says
"exactly": ``params/1`` and its tensor entries, and claims (``value`` and ``verifier``).
Problems are reported as ``/json/pointer: why``, all of them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .objects import is_object_id


def pointer_token(key: str | int) -> str:
    """One RFC 6901 reference token: ``~`` as ``~0``, ``/`` as ``~1``."""
    return str(key).replace("~", "~0").replace("/", "~1")


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_RECIPE = re.compile(r"^[^@\s]+@[^@\s]+$")
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8,
    "U16": 16, "I16": 16, "F16": 16, "BF16": 16,
    "U32": 32, "I32": 32, "F32": 32,
    "U64": 64, "I64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
"""safetensors dtype names and the bits one element takes."""
SAFETENSORS_DTYPES = frozenset(DTYPE_BITS)
RECEIPT_STATUSES = ("succeeded", "failed")


class _Schema:
    """Collects problems as ``/json/pointer: why`` strings while checking one record."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def bad(self, path: str, why: str) -> None:
        self.problems.append(f"{path or '/'}: {why}")

    def member(self, obj: dict[str, Any], path: str, key: str,
               check: Callable[[Any, str], Any]) -> None:
        where = f"{path}/{pointer_token(key)}"
        if key not in obj:
            self.bad(where, "required member is missing")
        else:
            check(obj[key], where)

    def exact_keys(self, obj: dict[str, Any], path: str, keys: set[str]) -> None:
        extra = sorted(set(obj) - keys)
        if extra:
            self.bad(path, f"unexpected member(s) {extra}; allowed exactly {sorted(keys)}")

    # value checkers: (value, path) -> None, recording problems
    def obj(self, value: Any, path: str) -> bool:
        if not isinstance(value, dict):
            self.bad(path, f"expected an object, found {_json_type(value)}")
            return False
        return True

    def string(self, value: Any, path: str) -> None:
        if not isinstance(value, str) or not value:
            self.bad(path, f"expected a non-empty string, found {_json_type(value)}")

    def count(self, value: Any, path: str) -> None:
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            self.bad(path, f"expected a non-negative integer, found {_short_json(value)}")

    def link(self, value: Any, path: str) -> None:
        if not is_object_id(value):
            self.bad(path, f"expected an object ID, found {_short_json(value)}")

    def link_or_null(self, value: Any, path: str) -> None:
        if value is not None:
            self.link(value, path)

    def link_map(self, value: Any, path: str) -> None:
        if self.obj(value, path):
            for key, item in value.items():
                self.link(item, f"{path}/{pointer_token(key)}")

    def hex64(self, value: Any, path: str) -> None:
        if not (isinstance(value, str) and _HEX64.fullmatch(value)):
            self.bad(path, f"expected 64 lowercase hex digits, found {_short_json(value)}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def _short_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _tree(s: _Schema, r: dict[str, Any]) -> None:
    def entries(value: Any, path: str) -> None:
        if not s.obj(value, path):
            return
        for rel, entry in value.items():
            where = f"{path}/{pointer_token(rel)}"
            parts = rel.split("/")
            if (not rel or rel.startswith("/") or "\x00" in rel
                    or any(p in ("", ".", "..") for p in parts)):
                s.bad(where, "not a normalised relative POSIX path")
            if s.obj(entry, where):
                s.member(entry, where, "id", s.link)
                s.member(entry, where, "size", s.count)
                s.member(entry, where, "sha256", s.hex64)
    s.member(r, "", "entries", entries)


def _params(s: _Schema, r: dict[str, Any]) -> None:
    s.exact_keys(r, "", {"nscas", "tensors"})

    def shape(value: Any, path: str) -> None:
        if not isinstance(value, list):
            s.bad(path, f"expected an array, found {_json_type(value)}")
            return
        for i, dim in enumerate(value):
            s.count(dim, f"{path}/{i}")

    def dtype(value: Any, path: str) -> None:
        if value not in SAFETENSORS_DTYPES:
            s.bad(path, f"not a safetensors dtype name: {_short_json(value)}")

    def tensors(value: Any, path: str) -> None:
        if not s.obj(value, path):
            return
        for name, tensor in value.items():
            where = f"{path}/{pointer_token(name)}"
            if not s.obj(tensor, where):
                continue
            s.exact_keys(tensor, where, {"dtype", "shape", "data"})
            s.member(tensor, where, "dtype", dtype)
            s.member(tensor, where, "shape", shape)
            s.member(tensor, where, "data", s.link)
    s.member(r, "", "tensors", tensors)


def _checkpoint(s: _Schema, r: dict[str, Any]) -> None:
    s.member(r, "", "files", s.link)
    s.member(r, "", "params", s.link)
    s.member(r, "", "step", s.count)
    s.member(r, "", "parent", s.link_or_null)


def _tasks(s: _Schema, r: dict[str, Any]) -> None:
    s.member(r, "", "role", s.string)
    s.member(r, "", "records", s.link)
    s.member(r, "", "count", s.count)

    def ids(value: Any, path: str) -> None:
        if not isinstance(value, list):
            s.bad(path, f"expected an array, found {_json_type(value)}")
            return
        for i, item in enumerate(value):
            s.string(item, f"{path}/{i}")
        if len(set(map(str, value))) != len(value):
            s.bad(path, "task ids repeat")
        if isinstance(r.get("count"), int) and r["count"] != len(value):
            s.bad(path, f"holds {len(value)} ids but count is {r['count']}")
    s.member(r, "", "ids", ids)


def _action(s: _Schema, r: dict[str, Any]) -> None:
    def recipe(value: Any, path: str) -> None:
        if not (isinstance(value, str) and _RECIPE.fullmatch(value)):
            s.bad(path, f"expected 'name@version', found {_short_json(value)}")
    s.member(r, "", "recipe", recipe)
    s.member(r, "", "code", s.link)
    s.member(r, "", "inputs", s.link_map)
    s.member(r, "", "params", s.obj)


def _environment(s: _Schema, r: dict[str, Any]) -> None:
    # docs/format.md §3 names only `python` and `platform` literally; the other facts it lists (package
    # versions, torch build, devices, determinism flags) have no fixed member names in v1.
    s.member(r, "", "python", s.string)
    s.member(r, "", "platform", s.string)


def _journal(s: _Schema, r: dict[str, Any]) -> None:
    s.member(r, "", "rank", s.count)

    def world(value: Any, path: str) -> None:
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            s.bad(path, f"expected a positive integer, found {_short_json(value)}")
        elif isinstance(r.get("rank"), int) and r["rank"] >= value:
            s.bad(path, f"rank {r['rank']} is not below world {value}")
    s.member(r, "", "world", world)
    s.member(r, "", "entries", s.link)

    def head(value: Any, path: str) -> None:
        if value is not None:
            s.hex64(value, path)
    s.member(r, "", "head", head)


def _commitment(s: _Schema, r: dict[str, Any]) -> None:
    s.member(r, "", "subjects", s.link_map)
    s.member(r, "", "purpose", s.string)
    s.member(r, "", "previous", s.link_or_null)


def _receipt(s: _Schema, r: dict[str, Any]) -> None:
    s.member(r, "", "action", s.link)
    s.member(r, "", "environment", s.link)
    s.member(r, "", "outputs", s.link_map)

    def journals(value: Any, path: str) -> None:
        if isinstance(value, list):
            for i, item in enumerate(value):
                s.link(item, f"{path}/{i}")
        elif isinstance(value, dict):
            s.link_map(value, path)
        else:
            s.bad(path, f"expected an array or object of IDs, found {_json_type(value)}")

    def claims(value: Any, path: str) -> None:
        if not s.obj(value, path):
            return
        for name, claim in value.items():
            where = f"{path}/{pointer_token(name)}"
            if not s.obj(claim, where):
                continue
            s.exact_keys(claim, where, {"value", "verifier"})
            if "value" not in claim:
                s.bad(f"{where}/value", "required member is missing")
            s.member(claim, where, "verifier", s.string)

    def moment(value: Any, path: str) -> None:
        if not (isinstance(value, str | int | float) and not isinstance(value, bool)):
            s.bad(path, f"expected a timestamp, found {_json_type(value)}")

    def status(value: Any, path: str) -> None:
        if value not in RECEIPT_STATUSES:
            s.bad(path, f"expected one of {list(RECEIPT_STATUSES)}, found {_short_json(value)}")
    s.member(r, "", "journals", journals)
    s.member(r, "", "claims", claims)
    s.member(r, "", "started", moment)
    s.member(r, "", "finished", moment)
    s.member(r, "", "status", status)
    for name in ("pipeline", "step"):  # optional: the pipeline and step a run came from
        if name in r:
            s.string(r[name], f"/{name}")
    if "variant" in r:  # optional: the variant of the run (docs/format.md §3.9): one ref part
        value = r["variant"]
        if not (isinstance(value, str) and _VARIANT.fullmatch(value) and ".." not in value):
            s.bad("/variant", f"expected a variant name (one ref part of at most 100 "
                              f"characters), found {_short_json(value)}")


_VARIANT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
_BASE64 = re.compile(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")


def _signature(s: _Schema, r: dict[str, Any]) -> None:
    """Exactly ``receipt`` (a link), ``public_key`` and a DSSE ``envelope``; what the envelope
    says is checked by ``signatures.py``."""
    s.exact_keys(r, "", {"nscas", "receipt", "public_key", "envelope"})
    s.member(r, "", "receipt", s.link)
    s.member(r, "", "public_key", s.string)

    def base64(value: Any, path: str) -> None:
        if not (isinstance(value, str) and value and _BASE64.fullmatch(value)):
            s.bad(path, f"expected non-empty standard base64, found {_short_json(value)}")

    def signatures(value: Any, path: str) -> None:
        if not isinstance(value, list) or not value:
            s.bad(path, f"expected a non-empty array, found {_short_json(value)}")
            return
        for i, item in enumerate(value):
            where = f"{path}/{i}"
            if s.obj(item, where):
                s.exact_keys(item, where, {"keyid", "sig"})
                s.member(item, where, "keyid", s.hex64)
                s.member(item, where, "sig", base64)

    def envelope(value: Any, path: str) -> None:
        if not s.obj(value, path):
            return
        s.exact_keys(value, path, {"payloadType", "payload", "signatures"})
        s.member(value, path, "payloadType", s.string)
        s.member(value, path, "payload", base64)
        s.member(value, path, "signatures", signatures)
    s.member(r, "", "envelope", envelope)


KINDS: dict[str, Callable[[_Schema, dict[str, Any]], None]] = {
    "tree/1": _tree,
    "params/1": _params,
    "checkpoint/1": _checkpoint,
    "tasks/1": _tasks,
    "action/1": _action,
    "environment/1": _environment,
    "journal/1": _journal,
    "commitment/1": _commitment,
    "receipt/1": _receipt,
    "signature/1": _signature,
}


def schema_problems(record: dict[str, Any]) -> list[str]:
    """Every schema violation of a parsed record of a known kind, as ``pointer: why``."""
    tag = record.get("nscas")
    if tag not in KINDS:
        return [f"/nscas: unknown kind {_short_json(tag)}"]
    schema = _Schema()
    KINDS[tag](schema, record)
    return schema.problems
