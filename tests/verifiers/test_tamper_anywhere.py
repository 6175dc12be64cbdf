"""Any single value changed anywhere in a consistent rewrite of the demo-like bundle is found.

Hypothesis picks one value of the bundle (a claim, a record member, a line of answers, checks,
retention losses, requests, journals or task sets, a member of report.json or resources.json)
and changes it; ``rewrite.Rewrite`` re-hashes it and rewrites everything above it, the
manifest, the tarball and SHA256SUMS. ``nscas verify`` (no ``--expect``) must then fail,
unless the change is confined to the fixed list of self-reported facts (docs/verify.md), which
are never picked here. The one other way a change may go unfound: an action param that only a
rerun could recheck, which the report must then name, with its changed value, among what it
did not recheck (``declared_not_rechecked``). The expectation is the spec's, not the
verifier's: nothing here reads verifier code.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import Demo, honest, verify_here
from .rewrite import Rewrite

LINK = re.compile(r"^blake3:[0-9a-f]{64}$")

SELF_REPORTED_LINES = {
    "journal": {"seconds"},
    "requests": {"start", "end", "wall_start", "wall_end"},
    "timings": {"seconds", "tokens_per_second"},
}
"""Members of log lines that are self-reported (plan14 / docs/verify.md), by log."""
SELF_REPORTED_RECORDS = {
    "journal/1": {"loop_seconds", "peak_memory_bytes"},
    "receipt/1": {"started", "finished", "pipeline", "step", "variant"},
}
"""Members of records that are self-reported; every member of environment/1 is, but for the
few cross-checked against the run, so environment records are not picked at all."""
REWRITTEN = {"hash", "prev"}
"""Journal chain members the rewriter recomputes (a change there is undone, not a forgery)."""


@dataclass(frozen=True, slots=True)
class Site:
    """One value of the bundle: a file, the line (JSONL) or None, and the path to it."""

    group: str
    path: str
    line: int | None
    pointer: tuple[str | int, ...]
    value: Any


def _log_kind(path: str) -> str | None:
    if path.startswith("training/") and path.endswith(".journal.jsonl"):
        return "journal"
    if path.startswith("serving/") and path.endswith("requests.jsonl"):
        return "requests"
    if path.startswith("evaluations/"):
        return path.rsplit("/", 1)[-1].removesuffix(".jsonl")
    if path.startswith("tasks/"):
        return "tasks"
    return None


def _leaves(value: Any, pointer: tuple[str | int, ...] = ()) -> Iterator[
        tuple[tuple[str | int, ...], Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*pointer, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*pointer, i))
    elif not (isinstance(value, str) and LINK.match(value)):
        yield pointer, value


def _sites(bundle: Path) -> dict[str, list[Site]]:
    """Every value that may be picked, grouped so that each kind of evidence is as likely."""
    manifest = json.loads((bundle / "manifest.json").read_bytes())
    groups: dict[str, list[Site]] = {}
    for path, entry in sorted(manifest["objects"].items()):
        if path.startswith(("code/", "models/")) or path.endswith((".png", ".pdf", ".svg",
                                                                     ".html")):
            continue
        data = (bundle / path).read_bytes()
        log = _log_kind(path)
        if entry["kind"] is not None:  # the honest bundle's labels are right
            record = json.loads(data)
            kind = record.get("nscas")
            if kind == "environment/1":
                continue
            skip = SELF_REPORTED_RECORDS.get(kind, set()) | {"nscas"}
            group = f"record:{kind}"
            for pointer, value in _leaves(record):
                if pointer and pointer[0] not in skip:
                    groups.setdefault(group, []).append(Site(group, path, None, pointer, value))
        elif log is not None:
            skip = SELF_REPORTED_LINES.get(log, set()) | (REWRITTEN if log == "journal" else set())
            for index, line in enumerate(data.decode().splitlines()):
                for pointer, value in _leaves(json.loads(line)):
                    if pointer and pointer[0] not in skip:
                        groups.setdefault(log, []).append(Site(log, path, index, pointer, value))
        elif path.endswith(".json"):
            group = path.rsplit("/", 1)[-1]
            for pointer, value in _leaves(json.loads(data)):
                groups.setdefault(group, []).append(Site(group, path, None, pointer, value))
    return groups


def changed(value: Any, how: int) -> Any:
    """Another value of the same kind, unmistakably different."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + (1, -1, 3)[how % 3]
    if isinstance(value, float):
        if not math.isfinite(value):
            return 0.0
        return value * (1.01, 0.97, 1.5)[how % 3] + (0.01 if value == 0 else 0.0)
    if isinstance(value, str):
        if re.fullmatch(r"[0-9a-f]+", value):
            return value[:-1] + ("1" if value[-1] != "1" else "2")
        return value + ("x", " ", "0")[how % 3]
    return (0, "", False)[how % 3]  # null


def _set(container: Any, pointer: tuple[str | int, ...], value: Any) -> None:
    for key in pointer[:-1]:
        container = container[key]
    container[pointer[-1]] = value


def forge(bundle: Path, dest: Path, site: Site, new: Any) -> Path:
    r = Rewrite(bundle, dest)
    if site.line is not None:
        def edit_lines(lines: list[Any]) -> None:
            _set(lines[site.line], site.pointer, new)
        r.edit_lines(site.path, edit_lines)
    elif site.group.startswith("record:"):
        r.edit_record(site.path, lambda record: _set(record, site.pointer, new))
    else:
        r.edit_json(site.path, lambda value: _set(value, site.pointer, new))
    return r.seal(check=False)


class Sites(dict[str, list[Site]]):
    def __repr__(self) -> str:  # hypothesis prints its arguments: not every value of a bundle
        return f"<{sum(map(len, self.values()))} sites in {len(self)} groups>"


@pytest.fixture(scope="module")
def sites(demo: Demo) -> Sites:
    honest(demo.bundle)
    return Sites(_sites(demo.bundle))


def test_every_group_of_evidence_has_values_to_change(sites: dict[str, list[Site]]) -> None:
    for group in ("record:receipt/1", "record:tasks/1", "record:journal/1", "record:action/1",
                  "report.json", "resources.json", "generations", "checks", "retention", "timings",
                  "requests", "journal", "tasks"):
        assert sites.get(group), (group, sorted(sites))


_counter = itertools.count()


def declared_not_rechecked(v: Any, site: Site, new: Any) -> bool:
    """An action param that only a rerun could recheck (an optimizer setting, a thread
    count) is not found by a plain verify, and may not be: but the report must then name that
    very param, with the changed value, among the checks it did not recheck (needs a model
    run). So may a journal step's parameter digest between checkpoints, which only a replay
    of training rechecks (docs/verify.md): the report must then list that very digest among
    the ones it did not recheck. Anything else unfound is a hole."""
    if site.group == "journal" and site.pointer == ("parameters",) and v.report is not None:
        return any(c["status"] == "skipped" and c["needs"] == "model"
                   and c["name"].endswith(".journals.parameters.replay")
                   and isinstance(c["claimed"], dict) and new in c["claimed"].values()
                   for c in v.report["checks"])
    if not (site.group == "record:action/1" and len(site.pointer) == 2
            and site.pointer[0] == "params") or v.report is None:
        return False
    return any(c["status"] == "skipped" and c["needs"] == "model"
               and c["name"].endswith(".params.rerun") and isinstance(c["claimed"], dict)
               and c["claimed"].get(site.pointer[1]) == new
               for c in v.report["checks"])


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_any_single_changed_value_is_found(demo: Demo, sites: dict[str, list[Site]],
                                           tmp_path_factory: pytest.TempPathFactory,
                                           data: st.DataObject) -> None:
    group = data.draw(st.sampled_from(sorted(sites)), label="group")
    site = data.draw(st.sampled_from(sites[group]), label="site")
    new = changed(site.value, data.draw(st.integers(0, 2), label="how"))
    dest = tmp_path_factory.mktemp("anywhere") / f"forged-{next(_counter)}"
    try:
        forged = forge(demo.bundle, dest, site, new)
        v = verify_here(forged)
        assert v.code != 0 or declared_not_rechecked(v, site, new), (
            f"not found: {site.path} line {site.line} "
            f"{'/'.join(map(str, site.pointer))}: {site.value!r} -> {new!r}")
    finally:
        shutil.rmtree(dest, ignore_errors=True)
