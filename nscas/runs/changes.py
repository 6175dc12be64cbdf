"""What differs between two runs of a step: the recipe version, every input and param as old ->
new, and the code files (docs/format.md §6.5, §6.6). ``nscas run`` says it for each step that
ran (a cache miss, or a rerun against another action); ``nscas compare`` for runs side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from nscas.objects.digests import Digest
from nscas.runs.codetree import CodeChanges, code_changes

if TYPE_CHECKING:
    from nscas.store.protocol import ObjectReader

class _Absent:
    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()
"""The value of a param or input in a run that does not have it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Change:
    """One input or param whose value differs: ``old`` in the earlier run, ``new`` in this
    one (``ABSENT`` where a run lacks it). A param's name is dotted for nested tables
    (``counts.test``); an input's values are IDs."""

    what: Literal["input", "param"]
    name: str
    old: Any
    new: Any

    def to_json(self) -> dict[str, Any]:
        """``{"what", "name", "old", "new"}``, with ``old`` or ``new`` left out where absent."""
        out: dict[str, Any] = {"what": self.what, "name": self.name}
        for key, value in (("old", self.old), ("new", self.new)):
            if value is not ABSENT:
                out[key] = str(value) if isinstance(value, Digest) else value
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheMiss:
    """Why a step's action had no receipt: how it differs from the last run of that step.

    ``previous`` is that run's receipt, ``None`` if none was found; ``recipe`` holds the old
    and new ``name@version`` when the version changed; ``inputs`` and ``params`` name what
    differs (params dotted) and ``changes`` gives each as old -> new; ``code`` is how the code
    tree changed.
    """

    previous: Digest | None
    recipe: tuple[str, str] | None = None
    inputs: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    changes: tuple[Change, ...] = ()
    code: CodeChanges = field(default_factory=CodeChanges)


def changes_between(old_inputs: Mapping[str, Any], new_inputs: Mapping[str, Any],
                    old_params: Mapping[str, Any], new_params: Mapping[str, Any]
                    ) -> tuple[Change, ...]:
    """Every input, then every param (both flat: nested params dotted), whose value differs,
    each in name order. Values differ when their types or values do (1 and 1.0 differ)."""
    sides: tuple[tuple[Literal["input", "param"], Mapping[str, Any], Mapping[str, Any]], ...] = (
        ("input", old_inputs, new_inputs), ("param", old_params, new_params))
    return tuple(Change(what=what, name=name, old=old.get(name, ABSENT), new=new.get(name, ABSENT))
                 for what, old, new in sides for name in sorted(old.keys() | new.keys())
                 if not same_value(old.get(name, ABSENT), new.get(name, ABSENT)))


def same_value(a: Any, b: Any) -> bool:
    """Equal values of the same type (``ABSENT`` equals only itself)."""
    if a is ABSENT or b is ABSENT:
        return a is b
    return type(a) is type(b) and a == b


def since(store: ObjectReader, receipt: Digest, new: Mapping[str, Any]) -> CacheMiss:
    """How the action record ``new`` differs from the action of the run ``receipt``."""
    old = store.get_record(Digest.parse(store.get_record(receipt)["action"]))
    return difference(store, receipt, old, new)


def difference(store: ObjectReader, receipt: Digest, old: Mapping[str, Any],
               new: Mapping[str, Any]) -> CacheMiss:
    """How action record ``new`` differs from ``old``, the action of the run ``receipt``."""
    before = store.get_record(Digest.parse(old["code"]))["entries"]
    after = store.get_record(Digest.parse(new["code"]))["entries"]
    changes = changes_between(old["inputs"], new["inputs"], flatten(old["params"]),
                              flatten(new["params"]))
    return CacheMiss(
        previous=receipt,
        recipe=(old["recipe"], new["recipe"]) if old["recipe"] != new["recipe"] else None,
        inputs=tuple(c.name for c in changes if c.what == "input"),
        params=tuple(c.name for c in changes if c.what == "param"),
        changes=changes, code=code_changes(before, after))


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects as dotted names (``{"counts": {"test": 8}}`` -> ``counts.test``)."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping) and item:
            out.update(flatten(item, f"{name}."))
        else:
            out[name] = item
    return out
