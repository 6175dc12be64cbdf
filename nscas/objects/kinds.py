"""Schemas of the v1 record kinds (docs/format.md §3) and their validation."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NoReturn

from nscas.errors import RecordError
from nscas.objects.digests import is_digest_text
from nscas.objects.dtypes import DTYPES

_KIND = re.compile(r"([a-z][a-z0-9-]*)/([1-9][0-9]*)")
_RECIPE = re.compile(r"[a-z][a-z0-9_-]*@[0-9A-Za-z.+-]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")

Validator = Callable[[dict[str, Any], str], None]


class _Check:
    """Small helpers that raise RecordError naming the kind and JSON path."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def fail(self, path: str, message: str) -> NoReturn:
        raise RecordError(message, kind=self.kind, path=path)

    def members(self, rec: dict[str, Any], required: set[str], *, exact: bool = False,
                path: str = "$") -> None:
        missing = sorted(required - rec.keys())
        if missing:
            self.fail(path, f"missing required member(s): {', '.join(missing)}")
        if exact:
            # Only the record itself carries "nscas"; nested objects may not sneak it in.
            extra = sorted(rec.keys() - required - ({"nscas"} if path == "$" else set()))
            if extra:
                self.fail(path, f"unexpected member(s): {', '.join(extra)}")

    def link(self, value: Any, path: str, *, nullable: bool = False) -> None:
        if value is None and nullable:
            return
        if not is_digest_text(value):
            self.fail(path, f"expected an object ID{' or null' if nullable else ''}, got {_show(value)}")

    def string(self, value: Any, path: str, *, nullable: bool = False) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, str) or not value:
            self.fail(path, f"expected a non-empty string, got {_show(value)}")

    def integer(self, value: Any, path: str, *, minimum: int = 0) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.fail(path, f"expected an integer >= {minimum}, got {_show(value)}")

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"expected an object, got {_show(value)}")
        return value

    def links_by_name(self, value: Any, path: str) -> None:
        for name, target in self.mapping(value, path).items():
            if not _NAME.fullmatch(name):
                self.fail(f"{path}.{name}", "names are letters, digits, '.', '_', '-' and '/'")
            self.link(target, f"{path}.{name}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def relpath_problem(path: object) -> str | None:
    """Why ``path`` is not a safe relative POSIX path, or None. The one rule for tree/1 entry
    paths and bundle paths (docs/format.md §3.1): not empty, no leading ``/``, no backslash or
    control character, no empty, ``.`` or ``..`` part."""
    if not isinstance(path, str) or not path:
        return "empty path"
    if path.startswith("/"):
        return "absolute path"
    if "\\" in path or any(ord(ch) < 32 or ord(ch) == 127 for ch in path):
        return "path holds a backslash or a control character"
    parts = path.split("/")
    if ".." in parts:
        return "path leaves its root ('..')"
    if "" in parts or "." in parts:
        return "path has an empty or '.' part"
    return None


def is_safe_relpath(path: object) -> bool:
    """True iff :func:`relpath_problem` finds nothing wrong with ``path``."""
    return relpath_problem(path) is None


def _tree(rec: dict[str, Any], kind: str) -> None:
    c = _Check(kind)
    c.members(rec, {"entries"})
    for path, entry in c.mapping(rec["entries"], "$.entries").items():
        where = f"$.entries[{path!r}]"
        if (problem := relpath_problem(path)) is not None:
            c.fail(where, f"{problem}: entry paths are relative POSIX paths without '.', '..' or "
                   "empty parts, backslashes or control characters")
        e = c.mapping(entry, where)
        c.members(e, {"id", "size", "sha256"}, exact=True, path=where)
        c.link(e["id"], f"{where}.id")
        c.integer(e["size"], f"{where}.size")
        if not isinstance(e["sha256"], str) or not _SHA256.fullmatch(e["sha256"]):
            c.fail(f"{where}.sha256", "expected 64 lowercase hex digits")


def _params(rec: dict[str, Any], kind: str) -> None:
    c = _Check(kind)
    c.members(rec, {"tensors"}, exact=True)
    for name, t in c.mapping(rec["tensors"], "$.tensors").items():
        where = f"$.tensors[{name!r}]"
        if not name:
            c.fail(where, "tensor names are non-empty")
        t = c.mapping(t, where)
        c.members(t, {"dtype", "shape", "data"}, exact=True, path=where)
        if t["dtype"] not in DTYPES:
            c.fail(f"{where}.dtype", f"unknown safetensors dtype {_show(t['dtype'])}")
        if not isinstance(t["shape"], list):
            c.fail(f"{where}.shape", "expected an array of integers")
        for i, dim in enumerate(t["shape"]):
            c.integer(dim, f"{where}.shape[{i}]")
        c.link(t["data"], f"{where}.data")


def _checkpoint(rec: dict[str, Any], kind: str) -> None:
    c = _Check(kind)
    c.members(rec, {"files", "params", "step", "parent"})
    c.link(rec["files"], "$.files")
    c.link(rec["params"], "$.params")
    c.integer(rec["step"], "$.step")
    c.link(rec["parent"], "$.parent", nullable=True)


def _tasks(rec: dict[str, Any], kind: str) -> None:
    c = _Check(kind)
    c.members(rec, {"role", "records", "count", "ids"})
    c.string(rec["role"], "$.role")
    c.link(rec["records"], "$.records")
    c.integer(rec["count"], "$.count")
    ids = rec["ids"]
    if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
        c.fail("$.ids", "expected an array of non-empty strings")
    if len(ids) != rec["count"]:
        c.fail("$.count", f"count is {rec['count']} but ids holds {len(ids)}")
    if len(set(ids)) != len(ids):
        c.fail("$.ids", "task ids repeat")


def _action(rec: dict[str, Any], kind: str) -> None:
    c = _Check(kind)
    c.members(rec, {"recipe", "code", "inputs", "params"})
    if not isinstance(rec["recipe"], str) or not _RECIPE.fullmatch(rec["recipe"]):
        c.fail("$.recipe", f"expected 'name@version', got {_show(rec['recipe'])}")
    c.link(rec["code"], "$.code")
    c.links_by_name(rec["inputs"], "$.inputs")
    c.mapping(rec["params"], "$.params")


def _environment(rec: dict[str, Any], kind: str) -> None:
    c = _Check(kind)
    c.members(rec, {"python", "platform", "packages", "torch", "devices", "determinism"})
    c.string(rec["python"], "$.python")
    c.string(rec["platform"], "$.platform")
    for name, version in c.mapping(rec["packages"], "$.packages").items():
        c.string(version, f"$.packages.{name}")
    if rec["torch"] is not None:
        c.mapping(rec["torch"], "$.torch")
    if not isinstance(rec["devices"], list):
        c.fail("$.devices", "expected an array")
    c.mapping(rec["determinism"], "$.determinism")


def _journal(rec: dict[str, Any], kind: str) -> None:
    c = _Check(kind)
    c.members(rec, {"rank", "world", "entries", "head"})
    c.integer(rec["world"], "$.world", minimum=1)
    c.integer(rec["rank"], "$.rank")
    if rec["rank"] >= rec["world"]:
        c.fail("$.rank", f"rank {rec['rank']} is not below world {rec['world']}")
    c.link(rec["entries"], "$.entries")
    head = rec["head"]
    if head is not None and (not isinstance(head, str) or not _SHA256.fullmatch(head)):
        c.fail("$.head", "expected the 64-hex hash of the last entry, or null")


def _commitment(rec: dict[str, Any], kind: str) -> None:
    c = _Check(kind)
    c.members(rec, {"subjects", "purpose", "previous"})
    c.links_by_name(rec["subjects"], "$.subjects")
    if not rec["subjects"]:
        c.fail("$.subjects", "a commitment fixes at least one subject")
    c.string(rec["purpose"], "$.purpose")
    c.link(rec["previous"], "$.previous", nullable=True)


def _receipt(rec: dict[str, Any], kind: str) -> None:
    c = _Check(kind)
    c.members(rec, {"action", "environment", "outputs", "journals", "claims", "started", "finished", "status"})
    c.link(rec["action"], "$.action")
    c.link(rec["environment"], "$.environment")
    c.links_by_name(rec["outputs"], "$.outputs")
    if not isinstance(rec["journals"], list):
        c.fail("$.journals", "expected an array of journal IDs")
    for i, j in enumerate(rec["journals"]):
        c.link(j, f"$.journals[{i}]")
    for name, claim in c.mapping(rec["claims"], "$.claims").items():
        where = f"$.claims[{name!r}]"
        claim = c.mapping(claim, where)
        c.members(claim, {"value", "verifier"}, exact=True, path=where)
        c.string(claim["verifier"], f"{where}.verifier")
    c.string(rec["started"], "$.started")
    c.string(rec["finished"], "$.finished")
    if rec["status"] not in ("succeeded", "failed"):
        c.fail("$.status", "expected 'succeeded' or 'failed'")
    if rec["status"] == "failed":
        c.string(rec.get("error"), "$.error")
    for name in ("pipeline", "step", "variant"):  # optional: where the run came from (§3.9)
        if name in rec:
            c.string(rec[name], f"$.{name}")
    if isinstance(rec.get("variant"), str) and not (
            _VARIANT.fullmatch(rec["variant"]) and ".." not in rec["variant"]):
        c.fail("$.variant", f"expected a variant name (one ref part, §6.10), got "
                            f"{_show(rec['variant'])}")


_VARIANT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")


def _signature(rec: dict[str, Any], kind: str) -> None:
    """A DSSE envelope over an in-toto statement about one receipt (§3.11). Its meaning (the
    subject, the key id, the signature itself) is checked by ``nscas.signing.signatures`` and by the
    verifiers; this is its shape."""
    c = _Check(kind)
    c.members(rec, {"receipt", "public_key", "envelope"}, exact=True)
    c.link(rec["receipt"], "$.receipt")
    c.string(rec["public_key"], "$.public_key")
    env = c.mapping(rec["envelope"], "$.envelope")
    c.members(env, {"payloadType", "payload", "signatures"}, exact=True, path="$.envelope")
    c.string(env["payloadType"], "$.envelope.payloadType")
    if not isinstance(env["payload"], str) or not env["payload"] \
            or not _BASE64.fullmatch(env["payload"]):
        c.fail("$.envelope.payload", "expected non-empty standard base64")
    sigs = env["signatures"]
    if not isinstance(sigs, list) or not sigs:
        c.fail("$.envelope.signatures", "expected a non-empty array")
    for i, sig in enumerate(sigs):
        where = f"$.envelope.signatures[{i}]"
        c.members(c.mapping(sig, where), {"keyid", "sig"}, exact=True, path=where)
        if not isinstance(sig["keyid"], str) or not _SHA256.fullmatch(sig["keyid"]):
            c.fail(f"{where}.keyid", "expected the 64-hex SHA-256 of the public key's DER")
        if not isinstance(sig["sig"], str) or not sig["sig"] or not _BASE64.fullmatch(sig["sig"]):
            c.fail(f"{where}.sig", "expected non-empty standard base64")


VALIDATORS: dict[str, Validator] = {
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
KINDS = tuple(VALIDATORS)


def kind_of(rec: dict[str, Any]) -> str:
    """The record's ``"<kind>/<version>"``, checked against the known kinds."""
    tag = rec.get("nscas")
    if not isinstance(tag, str) or not _KIND.fullmatch(tag):
        raise RecordError("member 'nscas' must be a string '<kind>/<version>'")
    if tag not in VALIDATORS:
        raise RecordError(f"unknown record kind or version {tag!r} (known: {', '.join(KINDS)})")
    return tag


def validate(rec: dict[str, Any]) -> str:
    """Validate ``rec`` against its kind's schema; return the kind."""
    kind = kind_of(rec)
    VALIDATORS[kind](rec, kind)
    return kind
