"""``nscas verify``: the independent verifiers' report on a receipt, ref or bundle.

Thin: parse, call ``nscas.verifiers.verify``, render. The verifiers raise their own errors
(they share no code with the store), so this command maps them to one-line messages and
docs/format.md §7 exit codes itself: 0 all hold, 1 a check failed, 2 bad input, 3 missing objects.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, state

app = command_app()

_STATUS_STYLE = {"passed": "green", "failed": "bold red", "skipped": "yellow"}
_CELL = 60
_FULL_ID = re.compile(r"(blake3:[0-9a-f]{12})[0-9a-f]{52}")


@app.command("verify")
def verify_(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(
        metavar="TARGET", show_default=False,
        help="A receipt ID (or unique prefix of 8+ hex digits), a ref name, or a bundle "
             "directory.")],
    as_json: JsonFlag = False,
    strict: Annotated[bool, typer.Option(
        "--strict", help="Also fail when checks could not be rechecked because weights were "
                         "omitted (checks that need a model run stay listed, not failed).")
    ] = False,
    expect: Annotated[str | None, typer.Option(
        "--expect", metavar="ID", show_default=False,
        help="Pin what was published: the full receipt ID (or the ID of the object TARGET "
             "names), or the SHA-256 of a published SHA256SUMS file. A mismatch fails.")
    ] = None,
    store: Annotated[Path | None, typer.Option(
        "--store", show_default=False, file_okay=False,
        help="The store to read (default: --store of nscas, $NSCAS_STORE, or search upwards).")
    ] = None,
    failures_only: Annotated[bool, typer.Option(
        "--failures-only", help="List only the checks that failed (the summary still counts "
                                "every check).")] = False,
) -> None:
    """Recheck a run independently: integrity, every claim, ordering rules.

    Re-hashes every object of TARGET's closure, recomputes each claim with the verifier it
    names, and checks that test-set scores came after the commitment. An output (such as a
    report ref) is verified through the receipt that produced it. The first line names the
    full receipt ID verified; the summary lists what was not rechecked and which facts are
    self-reported; it comes first, after the target line. Exits 0 if all hold, 1 if a check failed, 2 on bad input, 3 if objects
    are missing or TARGET has no receipt.

    Example: nscas verify experiments/coop/report; offline: nscas verify bundle/ --strict
    --expect <the published SHA-256 of bundle/SHA256SUMS>
    """
    from nscas.verifiers.errors import VerifierError
    from nscas.verifiers.verify import error_exit_code, exit_code, verify

    try:
        report = verify(target, store=store or state(ctx).store, strict=strict, expect=expect)
    except VerifierError as exc:
        render.error(exc.message)
        raise typer.Exit(error_exit_code(exc)) from None
    checks = [c for c in report.checks if c.status == "failed"] if failures_only else list(report.checks)
    if as_json:
        out = report.to_dict()
        if failures_only:
            out["checks"] = [c.to_dict() for c in checks]
        render.json_out(out)
    else:
        render.text(_first_line(report))
        if render.is_tty():
            _rich_table(report, checks)
        else:
            render.text(report.summary())
            if checks:
                render.table(("check", "claimed", "recomputed", "status", "message"),
                             [(c.name, _cell(c.claimed), _cell(c.recomputed), c.status,
                               c.message) for c in checks])
        for note in report.notes():
            render.text(note)
    code = exit_code(report)
    if code:
        raise typer.Exit(code)


def _first_line(report: Any) -> str:
    named = f" (the receipt that produced {report.named})" if report.named else ""
    return f"target {report.target}{named}"


def _cell(value: Any, *, abbreviate: bool = False) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    if abbreviate:  # IDs cut to 12 hex digits: still valid prefixes
        text = _FULL_ID.sub(r"\1", text)
    return text if len(text) <= _CELL else text[:_CELL - 3] + "..."


def _rich_table(report: Any, checks: list[Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    def short(value: Any) -> str:
        return escape(_cell(value, abbreviate=True))

    console = Console(file=sys.stdout, highlight=False)
    style = "bold green" if report.ok else "bold red"
    console.print(f"[{style}]{escape(report.summary())}[/]")
    if not checks:
        return
    table = Table(title="nscas verify", title_justify="left")
    table.add_column("check", no_wrap=True)
    table.add_column("claimed", overflow="fold")
    table.add_column("recomputed", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("message", overflow="fold")
    for check in checks:
        style = _STATUS_STYLE[check.status]
        table.add_row(escape(check.name), short(check.claimed), short(check.recomputed),
                      f"[{style}]{check.status}[/]", escape(_FULL_ID.sub(r"\1", check.message)))
    console.print(table)
