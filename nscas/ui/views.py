"""What each page shows, read from the store: frozen views the templates only lay out.

The compare page is ``nscas.ui.comparison``'s; lineage is ``nscas.store.lineage``'s walk. Every read goes through a ``StoreReader``: nothing here can
write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nscas.errors import InvalidInput, NotFound, NscasError
from nscas.objects.digests import Digest
from nscas.runs.side_by_side import headline_claims
from nscas.store.lineage import Direction, lineage
from nscas.ui import preview
from nscas.ui.charts import Series, line_chart
from nscas.ui.files import FOLDER_KINDS, Folder, folder
from nscas.ui.graph import Graph, build_graph
from nscas.ui.model import ModelSummary
from nscas.ui.model import summary as model_summary
from nscas.ui.render import duration

if TYPE_CHECKING:
    from markupsafe import Markup

    from nscas.store.reading import ObjectInfo, StoreReader

RECEIPTS_SCANNED = 5000
"""Newest receipts a filtered experiments page looks through."""
REFS_SHOWN = 500
LINKS_SHOWN = 200
HEADLINE_SHOWN = 6
JOURNAL_BYTES = 64 << 20
"""Journal entries read for the curves, at most (a longer journal is drawn from its start)."""


# ------------------------------------------------------------------ experiments


@dataclass(frozen=True, slots=True, kw_only=True)
class RefRow:
    name: str
    target: Digest
    kind: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptRow:
    id: Digest
    recipe: str
    status: str
    pipeline: str | None
    step: str | None
    started: str
    seconds: float | None
    headline: tuple[tuple[str, Any], ...]
    more_claims: int
    refs: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Experiments:
    refs: tuple[RefRow, ...]
    refs_more: int
    receipts: tuple[ReceiptRow, ...]
    recipes: tuple[str, ...]
    """Recipe names seen among the receipts scanned (for the filter)."""
    scanned: int
    truncated: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ExperimentFilter:
    recipe: str | None = None
    ref: str | None = None
    status: str | None = None
    limit: int = 50


def experiments(store: StoreReader, f: ExperimentFilter) -> Experiments:
    all_refs = store.ref_list(f.ref or "")
    kinds = store.kinds_of([t for _, t in all_refs])
    refs = tuple(RefRow(name=n, target=t, kind=kinds.get(t)) for n, t in all_refs[:REFS_SHOWN])
    named: dict[Digest, list[str]] = {}
    for n, t in all_refs:
        named.setdefault(t, []).append(n)
    rows: list[ReceiptRow] = []
    recipes: set[str] = set()
    infos = store.log(kind="receipt/1", limit=RECEIPTS_SCANNED)
    actions: dict[str, str] = {}
    scanned = 0
    for info in infos:
        if len(rows) >= f.limit:
            break
        scanned += 1
        rec = store.get_record(info.id)
        action = str(rec.get("action"))
        if action not in actions:
            actions[action] = str(store.get_record(Digest.parse(action)).get("recipe"))
        recipe = actions[action]
        recipes.add(recipe.partition("@")[0])
        if f.recipe and recipe.partition("@")[0] != f.recipe and recipe != f.recipe:
            continue
        if f.status and rec.get("status") != f.status:
            continue
        outputs = [Digest.parse(v) for v in rec.get("outputs", {}).values()]
        ref_names = tuple(sorted({n for d in (info.id, *outputs) for n in named.get(d, ())}))
        if f.ref and not ref_names:
            continue
        heads = list(headline_claims(rec.get("claims", {})).items())
        rows.append(ReceiptRow(
            id=info.id, recipe=recipe, status=str(rec.get("status")),
            pipeline=_str(rec.get("pipeline")), step=_str(rec.get("step")),
            started=str(rec.get("started")), seconds=duration(rec.get("started"),
                                                               rec.get("finished")),
            headline=tuple(heads[:HEADLINE_SHOWN]), more_claims=max(0, len(heads) - HEADLINE_SHOWN),
            refs=ref_names))
    return Experiments(refs=refs, refs_more=max(0, len(all_refs) - REFS_SHOWN),
                       receipts=tuple(rows), recipes=tuple(sorted(recipes)), scanned=scanned,
                       truncated=len(infos) == RECEIPTS_SCANNED)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# ------------------------------------------------------------------ a receipt


@dataclass(frozen=True, slots=True, kw_only=True)
class Linked:
    name: str
    id: Digest
    kind: str | None
    size: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimRow:
    name: str
    value: Any
    verifier: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalRow:
    id: Digest
    rank: Any
    world: Any
    entries: int
    updates: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceiptView:
    id: Digest
    record: dict[str, Any]
    recipe: str
    action: Digest
    status: str
    error: str | None
    seconds: float | None
    inputs: tuple[Linked, ...]
    outputs: tuple[Linked, ...]
    params: dict[str, Any]
    environment: Digest | None
    environment_record: dict[str, Any] | None
    journals: tuple[JournalRow, ...]
    charts: tuple[Markup, ...]
    claims: tuple[ClaimRow, ...]
    refs: tuple[str, ...]
    baseline: Digest | None
    """An evaluate run's baseline receipt (for the compare link)."""


class NotAReceipt(NscasError):
    """The receipt page asked for something that is not a receipt (it has an object page)."""

    exit_code = 2

    def __init__(self, oid: Digest, kind: str | None) -> None:
        super().__init__(f"{oid} is {'a ' + kind if kind else 'a blob'}, not a receipt")
        self.oid = oid
        self.kind = kind


def receipt(store: StoreReader, oid: Digest) -> ReceiptView:
    info = store.info(oid)
    if info.kind != "receipt/1":
        raise NotAReceipt(oid, info.kind)
    rec = store.get_record(oid)
    action_id = Digest.parse(rec["action"])
    action = store.get_record(action_id)
    inputs = _linked(store, action.get("inputs", {}))
    outputs = _linked(store, rec.get("outputs", {}))
    env_id = Digest.parse(rec["environment"]) if isinstance(rec.get("environment"), str) else None
    env = store.get_record(env_id) if env_id is not None and store.has(env_id) else None
    journals, loss, lr = [], [], []
    for jid_text in rec.get("journals", []):
        jid = Digest.parse(jid_text)
        jrec = store.get_record(jid)
        entries = _journal_entries(store, Digest.parse(jrec["entries"]))
        updates = [e for e in entries if "loss" in e and "step" in e]
        label = f"rank {jrec.get('rank')}"
        loss.append(Series(label=label, points=tuple(
            (float(e["step"]), float(e["loss"])) for e in updates if _num(e["loss"], e["step"]))))
        lr.append(Series(label=label, points=tuple(
            (float(e["step"]), float(e["lr"])) for e in updates if _num(e.get("lr"), e["step"]))))
        journals.append(JournalRow(id=jid, rank=jrec.get("rank"), world=jrec.get("world"),
                                   entries=len(entries), updates=len(updates)))
    charts: tuple[Markup, ...] = ()
    if journals:
        charts = (line_chart("loss", loss), line_chart("learning rate", lr))
    claims = tuple(ClaimRow(name=k, value=v.get("value"), verifier=str(v.get("verifier")))
                   for k, v in sorted(rec.get("claims", {}).items()))
    refs = tuple(n for n, t in store.ref_list() if t == oid)
    baseline = next((i.id for i in inputs if i.name == "baseline" and i.kind == "receipt/1"), None)
    return ReceiptView(
        id=oid, record=rec, recipe=str(action.get("recipe")), action=action_id,
        status=str(rec.get("status")), error=_str(rec.get("error")),
        seconds=duration(rec.get("started"), rec.get("finished")), inputs=inputs,
        outputs=outputs, params=action.get("params", {}), environment=env_id,
        environment_record=env, journals=tuple(journals), charts=charts, claims=claims,
        refs=refs, baseline=baseline)


def _num(*values: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _linked(store: StoreReader, names: Mapping[str, Any]) -> tuple[Linked, ...]:
    ids = {k: Digest.parse(v) for k, v in sorted(names.items()) if isinstance(v, str)}
    kinds = store.kinds_of(list(ids.values()))
    out = []
    for name, oid in ids.items():
        present = oid in kinds
        out.append(Linked(name=name, id=oid, kind=kinds.get(oid),
                          size=store.info(oid).size if present else None))
    return tuple(out)


def _journal_entries(store: StoreReader, oid: Digest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    read = 0
    with store.open(oid) as f:
        for line in f:
            read += len(line)
            if read > JOURNAL_BYTES:
                break
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
    return out


# ------------------------------------------------------------------ an object


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkRow:
    path: str
    id: Digest
    kind: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectView:
    info: ObjectInfo
    record: dict[str, Any] | None
    links_from: tuple[LinkRow, ...]
    links_to: tuple[LinkRow, ...]
    links_to_more: bool
    refs: tuple[str, ...]
    sniffed: preview.Sniffed | None
    text: preview.TextPreview | None = None
    table: preview.TablePage | None = None
    tensors: preview.TensorTable | None = None
    hexdump: preview.HexPreview | None = None
    producer: Digest | None = None
    model: ModelSummary | None = None
    """A checkpoint's architecture, parameters, dtypes, size and lineage."""
    folder: Folder | None = None
    """A checkpoint's or tree's files, for download one by one or as one tar."""
    folder_problem: str | None = None
    """Why its files cannot be downloaded (a file missing from this store, an unsafe path)."""


def object_view(store: StoreReader, oid: Digest, *, page: int = 1) -> ObjectView:
    from nscas.store.provenance import producers

    info = store.info(oid)
    out_links = store.links_from(oid)
    in_links = store.links_to(oid, limit=LINKS_SHOWN + 1)
    kinds = store.kinds_of([lk.child for lk in out_links] + [lk.parent for lk in in_links])
    base: dict[str, Any] = {
        "info": info,
        "links_from": tuple(LinkRow(path=lk.path, id=lk.child, kind=kinds.get(lk.child))
                            for lk in out_links),
        "links_to": tuple(LinkRow(path=lk.path, id=lk.parent, kind=kinds.get(lk.parent))
                          for lk in in_links[:LINKS_SHOWN]),
        "links_to_more": len(in_links) > LINKS_SHOWN,
        "refs": tuple(n for n, t in store.ref_list() if t == oid),
        "producer": producers(store, oid).first if info.kind != "receipt/1" else None,
    }
    if info.kind is not None:
        record = store.get_record(oid)
        if info.kind in FOLDER_KINDS:
            try:
                base["folder"] = folder(store, oid)
            except (NotFound, InvalidInput) as exc:
                base["folder_problem"] = exc.message
        if info.kind == "checkpoint/1":
            base["model"] = model_summary(store, oid, record)
        return ObjectView(**base, record=record, sniffed=None)
    sniffed = preview.sniff(store, oid)
    extra: dict[str, Any] = {}
    if sniffed.kind == "jsonl":
        extra["table"] = preview.jsonl_page(store, oid, page)
    elif sniffed.kind == "safetensors":
        extra["tensors"] = preview.safetensors_header(store, oid)
    elif sniffed.kind in ("json", "text", "html", "svg"):
        extra["text"] = preview.text_preview(store, oid)
    elif sniffed.kind == "binary":
        extra["hexdump"] = preview.hex_preview(store, oid)
    return ObjectView(**base, record=None, sniffed=sniffed, **extra)


# ------------------------------------------------------------------ lineage


@dataclass(frozen=True, slots=True, kw_only=True)
class LineageView:
    root: Digest
    root_kind: str | None
    direction: Direction
    graph: Graph
    expanded: tuple[Digest, ...]


def lineage_view(store: StoreReader, oid: Digest, *, direction: Direction,
                 depth: int | None, hide: frozenset[str], max_nodes: int,
                 expand: Sequence[Digest] = ()) -> LineageView:
    """The graph of ``nscas lineage`` from ``oid``, with the lineage of each expanded node
    (as far again) joined in where that node is."""
    root = lineage(store, oid, direction=direction, depth=depth, hide=hide, max_nodes=max_nodes)
    trees = [(root, 0)]
    for node in expand:
        trees.append((lineage(store, node, direction=direction, depth=depth, hide=hide,
                              max_nodes=max_nodes), 0))
    return LineageView(root=oid, root_kind=root.kind, direction=direction,
                       graph=build_graph(trees), expanded=tuple(expand))
