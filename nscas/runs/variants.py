"""Variants: a run with ``--set`` overrides (or ``--name``) is a named variant of its file, with
refs of its own, so it never moves the refs of the run without them (docs/format.md §6.10).

The name is a function of the overrides alone, step by step, so that a sweep can name each of
its arms the same way: ``variant_name({("train", "lr"): 3e-4})`` is ``train.lr-3e-4``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nscas.errors import ConfigError, RecordError
from nscas.objects import canonical
from nscas.objects.digests import Digest
from nscas.runs.config import RunFile, downstream, override_target, parse_override

VARIANTS = "variants"
"""The ref part between a prefix and a variant's name: ``<prefix>/variants/<name>``."""
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
"""A variant name: one ref part (docs/format.md §5.7)."""
NAME_MAX = 100
"""The longest variant name; a longer derived name is cut and keeps its digest."""
_KEY_PART = re.compile(r"[A-Za-z0-9_]+")
_STEP_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
_PLAIN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9.-]*")
_WORDS = frozenset({"true", "false", "inf", "nan"})
_DIGEST_HEX = 8

Settings = Mapping[tuple[str, ...], Any]
"""What a variant sets: key path (step name first, in a pipeline) -> the value, as TOML read it."""


def variant_name(settings: Settings) -> str:
    """The variant name of these settings: each ``key-value`` (the key path dotted, the value
    as written below), sorted by key, joined by ``_``.

    Numbers are written shortest (``3e-4``, ``0.5``, ``-2``, ``1e20``, ``1.0``; an integer
    has no ``.``, a float always has a ``.`` or an exponent), booleans ``true`` and ``false``, strings
    as they are. That reads back exactly while the key's parts are letters, digits and ``_``
    (its first part, a step's name, may hold ``-`` too), and every string starts with a letter,
    holds only letters, digits, ``.`` and ``-`` and is none of ``true``, ``false``, ``inf``,
    ``nan``. Otherwise (and for a list or table, written as compact JSON, or a name over
    ``NAME_MAX`` or holding ``..``) runs of characters outside ``[A-Za-z0-9._-]`` become one
    ``-`` (runs of ``.`` one ``.``, of ``-`` one ``-``) and ``.`` plus 8 hex digits of
    the settings' BLAKE3 digest (of RFC 8785 ``{"settings": [[key, value], ...]}``) are
    appended, so that two different settings never share a name.
    """
    if not settings:
        raise ValueError("a variant sets at least one param")
    tokens: list[str] = []
    exact = True
    for key in sorted(settings):
        value, plain = _value_text(settings[key])
        exact = exact and plain and _plain_key(key)
        tokens.append(f"{'.'.join(key)}-{value}")
    name = "_".join(tokens)
    if exact and len(name) <= NAME_MAX and ".." not in name:
        return name
    readable = re.sub(r"-{2,}", "-", re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._-]+", "-",
                                                                       name)))
    if not re.match(r"[A-Za-z0-9_]", readable):
        readable = "_" + readable
    return f"{readable[:NAME_MAX - _DIGEST_HEX - 1].rstrip('.-')}.{_digest(settings)}"


def check_name(name: str, where: str = "--name") -> str:
    """``name`` if it can name a variant (one ref part, at most ``NAME_MAX`` characters, no
    ``..``); else a ``ConfigError`` saying so."""
    if not NAME.fullmatch(name) or ".." in name or len(name) > NAME_MAX:
        raise ConfigError(where, f"{name!r} cannot name a variant: one ref part of letters, "
                                 f"digits, '.', '_' and '-' (no '..'), at most {NAME_MAX} long")
    return name


def variant_prefix(prefix: str, variant: str | None) -> str:
    """Where a variant's refs go for a ref or ref prefix of the file: ``<prefix>/variants/<name>``
    (the prefix itself for the run without overrides)."""
    return prefix if variant is None else f"{prefix}/{VARIANTS}/{variant}"


def step_refs(prefix: str, variant: str | None, step: str,
              outputs: tuple[str, ...]) -> list[tuple[str, str]]:
    """(output or ``receipt``, ref): the refs a pipeline's ``refs`` prefix gives one step,
    ``<prefix>[/variants/<name>]/<step>/<output>`` and ``.../<step>/receipt``."""
    base = f"{variant_prefix(prefix, variant)}/{step}"
    return [(output, f"{base}/{output}") for output in (*outputs, "receipt")]


def _value_text(value: Any) -> tuple[str, bool]:
    """(the value as a name writes it, whether it reads back exactly)."""
    if isinstance(value, bool):
        return ("true" if value else "false"), True
    if isinstance(value, int):
        return str(value), True
    if isinstance(value, float):
        return _float_text(value), True
    if isinstance(value, str):
        return value, bool(_PLAIN_TEXT.fullmatch(value)) and value not in _WORDS
    return json.dumps(value, separators=(",", ":"), sort_keys=True), False


def _float_text(value: float) -> str:
    """The shorter of Python's shortest round-trip text and the shortest exact ``<m>e<exp>``
    (``3e-4``, not ``0.0003``; ``0.5``, not ``5e-1``), exponents without ``+`` or zeros."""
    if not math.isfinite(value):
        return str(value)
    texts = []
    for text in (repr(value), next(t for t in (f"{value:.{n}e}" for n in range(17))
                                   if float(t) == value)):
        mantissa, _, exponent = text.partition("e")
        texts.append(f"{mantissa}e{int(exponent)}" if exponent else mantissa)
    return min(texts, key=len)


def _plain_key(key: tuple[str, ...]) -> bool:
    """Whether a key reads back from its dotted text: a value starts after the first ``-``
    that follows the step's name, which is the first part only where there are more."""
    first, rest = (key[0], key[1:]) if len(key) > 1 else ("", key)
    return ((not first or bool(_STEP_PART.fullmatch(first)))
            and all(_KEY_PART.fullmatch(part) for part in rest))


def _digest(settings: Settings) -> str:
    items = [[list(key), settings[key]] for key in sorted(settings)]
    try:
        data = canonical.encode({"settings": items})
    except RecordError:  # a value no record holds (NaN): its text still names it uniquely
        data = repr(items).encode()
    return Digest.of(data).hex[:_DIGEST_HEX]


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    """The variant a run is: its name, and the steps it changes (those whose params it sets and
    every step downstream of them), whose earlier runs are the variant's own."""

    name: str
    changed: frozenset[str]


def plan_variant(spec: RunFile, sets: tuple[str, ...], name: str | None) -> Variant | None:
    """The variant of a run of ``spec`` with these ``--set`` texts and ``--name``; None for the
    run without either. ``--name`` alone names a variant that changes no params."""
    if not sets and name is None:
        return None
    settings: dict[tuple[str, ...], Any] = {}
    changed: set[str] = set()
    for item in (parse_override(text) for text in sets):
        step, path = override_target(spec, item)
        settings[(step, *path) if spec.pipeline else path] = item.value
        changed |= {step, *downstream(spec.steps, step)}
    return Variant(name=check_name(name) if name is not None else variant_name(settings),
                   changed=frozenset(changed))
