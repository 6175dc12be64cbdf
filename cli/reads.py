"""What ``log``, ``show`` and ``lineage`` do, without typer.

These three are the read commands people run most, so nscas.cli.fast parses them and calls
these functions without importing typer (a large part of a read command's start-up);
cli/log.py, cli/show.py and cli/lineage.py declare the same options for typer (its
``--help``, completion and usage errors) and call the same functions. ``store`` is the
``--store`` option: None searches upwards for ``.nscas``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nscas.cli import render
from nscas.objects.digests import Digest

if TYPE_CHECKING:
    from nscas.store.lineage import Node

_CLAIMS_SHOWN = 4  # headline claims per receipt in the table (--json has them all, exact)
_LINKED_FROM_SHOWN = 10


def iso_time(timestamp: float) -> str:
    """Seconds since the epoch as ISO 8601 UTC, to the second (``2025-01-31T12:00:00Z``)."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reader(store: Path | None) -> Any:
    """A read-only store (a StoreReader: SQLAlchemy stays unloaded)."""
    from nscas.store.opening import open_store

    return open_store(store, readonly=True)


def log(store: Path | None, *, kind: str | None, limit: int, as_json: bool) -> None:
    """``nscas log``: records newest first; receipts with their run and headline claims."""
    if kind is not None:
        _check_kind(kind)
    entries: list[dict[str, Any]] = []
    with _reader(store) as reader:
        infos = reader.log(kind=kind, limit=limit)
        # The receipts, then their actions: two reads for the whole listing, not two a receipt.
        receipts = reader.get_records(i.id for i in infos if i.kind == "receipt/1")
        actions = reader.get_records(Digest.parse(r["action"]) for r in receipts.values())
        if receipts:
            from nscas.runs.side_by_side import headline_claims
        for info in infos:
            entry: dict[str, Any] = {"id": str(info.id), "kind": info.kind,
                                     "time": iso_time(info.created), "size": info.size}
            if info.kind == "receipt/1":
                receipt = receipts[info.id]
                entry["status"] = receipt["status"]
                entry["recipe"] = actions[Digest.parse(receipt["action"])]["recipe"]
                for key in ("pipeline", "step", "variant"):
                    value = receipt.get(key)
                    entry[key] = value if isinstance(value, str) else None
                entry["claims"] = headline_claims(receipt["claims"])
            entries.append(entry)
    if as_json:
        render.json_out(entries)
        return
    if not entries:
        render.text("No records" + (f" of kind {kind}" if kind else "") + " are stored.")
        return
    columns = ["time", "kind", "size", "id"]
    with_receipts = any("recipe" in e for e in entries)
    with_variants = any(e.get("variant") for e in entries)
    if with_receipts:
        columns += ["step", *(["variant"] if with_variants else []), "recipe", "status", "claims"]
    rows = []
    for e in entries:
        row = [str(e[c]) for c in ("time", "kind", "size", "id")]
        if with_receipts:
            row.append(_step(e))
            if with_variants:
                row.append(e.get("variant") or ("-" if "recipe" in e else ""))
            row += [e.get("recipe", ""), e.get("status", ""), _claims(e)]
        rows.append(row)
    render.table(columns, rows)


def _check_kind(kind: str) -> None:
    """Refuse a kind no record can have (a typo lists nothing, which reads as "none stored")."""
    from nscas.objects.kinds import KINDS

    if kind not in KINDS:
        from nscas.errors import InvalidInput
        from nscas.suggestions import closest

        # Matched on the name, so that 'receipt' and 'receipt/2' also find 'receipt/1'.
        by_name = {known.partition("/")[0]: known for known in KINDS}
        found = closest(kind.partition("/")[0], by_name)
        hint = f"; did you mean {by_name[found]!r}?" if found else ""
        raise InvalidInput(f"--kind: unknown record kind {kind!r}{hint} "
                           f"(kinds: {', '.join(KINDS)})")


def _step(entry: dict[str, Any]) -> str:
    step, pipeline = entry.get("step"), entry.get("pipeline")
    if step is None:
        return "-" if "recipe" in entry else ""
    return f"{pipeline}/{step}" if pipeline else step


def _claims(entry: dict[str, Any]) -> str:
    if "claims" not in entry:
        return ""
    claims = entry["claims"]
    shown = [f"{k}={render.human(v)}" for k, v in list(claims.items())[:_CLAIMS_SHOWN]]
    if len(claims) > _CLAIMS_SHOWN:
        shown.append(f"+{len(claims) - _CLAIMS_SHOWN} more")
    return ", ".join(shown) or "-"


def show(store: Path | None, *, id_: str, as_json: bool) -> None:
    """``nscas show``: one object's metadata; for a record, its JSON, links and referrers."""
    with _reader(store) as reader:
        oid = reader.resolve(id_)
        info = reader.info(oid)
        record = reader.get_record(oid) if info.kind is not None else None
        if as_json:
            out: dict[str, Any] = {"id": str(oid), "kind": info.kind or "blob", "size": info.size,
                                   "sha256": info.sha256}
            if record is not None:
                out["record"] = record
            render.json_out(out)
            return
        links = reader.links_from(oid) if record is not None else []
        referrers = reader.links_to(oid, limit=_LINKED_FROM_SHOWN + 1)
        kinds = reader.kinds_of([lk.child for lk in links] + [lk.parent for lk in referrers])
    render.fields([
        ("id", str(oid)),
        ("kind", info.kind or "blob"),
        ("size", f"{info.size} bytes"),
        ("sha256", info.sha256 or "not known yet: computed on first use (docs/format.md §1.2)"),
        ("stored", f"{info.storage}, {info.codec}, {info.stored_size} bytes"),
        ("created", iso_time(info.created)),
    ])
    if record is not None:
        render.text()
        render.record(record)
    if links:
        render.text()
        render.table(["path", "kind", "id"],
                     [[lk.path, kinds.get(lk.child) or "blob", str(lk.child)] for lk in links],
                     title=f"links ({len(links)})")
    if referrers:
        shown = referrers[:_LINKED_FROM_SHOWN]
        more = " (first few)" if len(referrers) > len(shown) else ""
        render.text()
        render.table(["kind", "id", "path"],
                     [[kinds.get(lk.parent) or "blob", str(lk.parent), lk.path] for lk in shown],
                     title=f"linked from{more}")


def lineage(store: Path | None, *, id_: str, up: bool, depth: int | None, hide: str,
            max_nodes: int, fmt: str, as_json: bool) -> None:
    """``nscas lineage``: the link graph around an object, as a tree, JSON or Graphviz dot."""
    from nscas.store import lineage as graph  # here: log and show need none of it

    hidden = graph.parse_hide(hide)
    direction = "up" if up else "down"
    with _reader(store) as reader:
        root = graph.lineage(reader, reader.resolve(id_), direction=direction, depth=depth,
                             hide=hidden, max_nodes=max_nodes)
    if as_json or fmt == "json":
        render.json_out(root.to_json())
    elif fmt == "dot":
        render.raw([graph.to_dot(root, direction=direction).encode()])
    else:
        render.tree(_branch(root))


def _branch(node: Node) -> render.Branch:
    from nscas.store.lineage import describe

    words = describe(node)
    label = " ".join([*words[:1], str(node.id)])
    if len(words) > 1:
        label += "  [" + ", ".join(words[1:]) + "]"
    if node.via is not None:
        produced = node.linked_from and node.via.startswith("$.outputs.")
        label += f"  {'produced it as' if produced else 'via'} {node.via}"
    if node.seen:
        label += "  (seen)"
    if node.more:
        label += f"  (+{node.more} more)"
    if node.hidden:
        label += f"  ({node.hidden} hidden)"
    return render.Branch(label=label, children=tuple(_branch(c) for c in node.children))
