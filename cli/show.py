"""``nscas show``: one object's metadata, its record, its links and what links to it."""

from __future__ import annotations

from typing import Any

import typer

from nscas.cli import render
from nscas.cli.common import IdArgument, JsonFlag, command_app, open_cli_store
from nscas.store.usage import usage

app = command_app()

_LINKED_FROM_SHOWN = 10
_BYTES_KINDS = (None, "tree/1", "checkpoint/1", "params/1")


@app.command()
def show(ctx: typer.Context, id_: IdArgument, as_json: JsonFlag = False) -> None:
    """Show an object: size, SHA-256, storage; for a record, its JSON, links and referrers.

    Example: nscas show experiments/coop/base
    """
    with open_cli_store(ctx, readonly=True) as reader:
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
        # What the bytes cost: for blobs and the records that are made of them (a receipt's
        # closure is a lineage, which ``nscas du`` walks when asked).
        cost = usage(reader, oid) if info.kind in _BYTES_KINDS else None
        links = reader.links_from(oid) if record is not None else []
        referrers = reader.links_to(oid, limit=_LINKED_FROM_SHOWN + 1)
        kinds = reader.kinds_of([lk.child for lk in links] + [lk.parent for lk in referrers])
    render.fields([
        ("id", str(oid)),
        ("kind", info.kind or "blob"),
        ("size", f"{info.size} bytes"),
        ("sha256", info.sha256 or "not known yet: computed on first use (docs/format.md §1.2)"),
        ("stored", f"{info.storage}, {info.codec}, {info.stored_size} bytes"
                   + (f", delta to {info.base}" if info.base is not None else "")),
        *([("raw/stored", f"{cost.raw} bytes raw, {cost.stored} stored ({cost.ratio:.3f}) in "
                          f"{cost.leaves} leaves; {cost.bases} bytes of delta bases besides")]
          if cost is not None else []),
        ("created", render.iso_time(info.created)),
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
