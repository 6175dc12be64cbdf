"""What push and pull print: one line (or JSON) saying what went across."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nscas.cli import render

if TYPE_CHECKING:
    from nscas.remotes.transfer import TransferReport


def report(done: TransferReport, where: str, as_json: bool) -> None:
    if as_json:
        render.json_out({"target": str(done.target), "ref": done.ref,
                         "producer": None if done.producer is None else str(done.producer),
                         "objects": done.objects,
                         "sent": done.sent, "bytes_sent": done.bytes_sent,
                         "ref_moved": done.ref_moved})
        return
    line = (f"{where}: {done.sent} of {done.objects} object(s) sent "
            f"({done.bytes_sent} bytes of leaves)")
    if done.ref is not None:
        line += f"; {done.ref} -> {done.target}" + ("" if done.ref_moved else " (already there)")
    if done.producer is not None:
        line += f"; with the receipt that produced it, {done.producer}"
    render.text(line)
