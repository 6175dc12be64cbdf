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

from nscas.cli import completion, render
from nscas.cli.common import JsonFlag, command_app, state

app = command_app()

_STATUS_STYLE = {"passed": "green", "failed": "bold red", "skipped": "yellow"}
_CELL = 60
_FULL_ID = re.compile(r"(blake3:[0-9a-f]{12})[0-9a-f]{52}")


@app.command("verify")
def verify_(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(
        metavar="TARGET", show_default=False, autocompletion=completion.refs,
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
        "--store", show_default=False,
        help="The store to read (default: --store of nscas, $NSCAS_STORE, or search upwards).")
    ] = None,
    failures_only: Annotated[bool, typer.Option(
        "--failures-only", help="List only the checks that failed (the summary still counts "
                                "every check).")] = False,
    trust: Annotated[list[Path] | None, typer.Option(
        "--trust", metavar="PUBKEY", show_default=False, dir_okay=False,
        help="A public key file (PEM, e.g. from 'nscas key new': FILE.pub) to trust; "
             "repeatable. Every receipt of the closure must then carry a valid signature by "
             "one of them.")] = None,
    replay: Annotated[int | None, typer.Option(
        "--replay", metavar="N", show_default=False, min=0, max=1_000_000,
        help="Also run the model: N test answers per evaluated arm, drawn with --replay-seed, "
             "must be the greedy choices of the committed weights, and the retention losses "
             "are recomputed (docs/format.md §7.8).")] = None,
    replay_seed: Annotated[int | None, typer.Option(
        "--replay-seed", metavar="SEED", show_default=False, min=0, max=2**63 - 1,
        help="Seed of the replay's draw (default: random, and printed).")] = None,
    replay_task: Annotated[list[str] | None, typer.Option(
        "--replay-task", metavar="ID", show_default=False,
        help="A task id to replay in every arm besides the drawn ones; repeatable.")] = None,
    device: Annotated[str, typer.Option(
        "--device", metavar="cpu|cuda", help="Where --replay runs the model.")] = "cpu",
    replay_steps: Annotated[int, typer.Option(
        "--replay-steps", metavar="K", min=0, max=1_000_000,
        help="With --replay: also replay K training updates after each published optimizer "
             "state (train param publish_state) and compare the parameter digests with the "
             "journal's (docs/format.md §7.8).")] = 0,
    replay_time_limit: Annotated[float | None, typer.Option(
        "--replay-time-limit", metavar="SECONDS", show_default=False, min=0.0, max=1e7,
        help="Bound on the whole replay; what is left is listed as not rechecked.")] = None,
    stream: Annotated[bool, typer.Option(
        "--stream", help="For programs: one JSON line per check as it is made "
                         "({\"check\": ...}), then {\"done\": ...} or {\"error\": ...}.")
    ] = False,
) -> None:
    """Recheck a run independently: integrity, every claim, ordering rules.

    Re-hashes every object of TARGET's closure, recomputes each claim with the verifier it
    names, and checks that test-set scores came after the commitment. An output (such as a
    report ref) is verified through the receipt that produced it. The first line names the
    full receipt ID verified; the summary lists what was not rechecked and which facts are
    self-reported; it comes first, after the target line. Exits 0 if all hold, 1 if a check failed, 2 on bad input, 3 if objects
    are missing or TARGET has no receipt.

    Signatures (signature/1 records) are checked where present; with --trust PUBKEY every
    receipt must be signed by a trusted key, and the summary names who signed each one.

    Example: nscas verify experiments/coop/report; offline: nscas verify bundle/ --strict
    --expect <the published SHA-256 of bundle/SHA256SUMS> --trust alice.key.pub
    """
    from nscas.verifiers.core.errors import VerifierError
    from nscas.verifiers.verify import error_exit_code, exit_code, verify

    if device not in ("cpu", "cuda"):
        render.error(f"--device must be cpu or cuda, not {device!r}")
        raise typer.Exit(2)
    if (replay_seed is not None or replay_task or replay_time_limit is not None
            or replay_steps) and replay is None:
        render.error("--replay-seed, --replay-task, --replay-steps and --replay-time-limit "
                     "need --replay N")
        raise typer.Exit(2)
    options = None
    if replay is not None:
        options = _replay_options(replay, replay_seed, tuple(replay_task or ()), device,
                                  replay_time_limit, quiet=as_json or stream,
                                  steps=replay_steps)
    progress = _stream_line if stream else None
    try:
        trusted = None
        if trust:
            from nscas.verifiers.signatures.checks import load_trusted

            trusted = load_trusted(trust)
        report = verify(target, store=store or state(ctx).store, strict=strict, expect=expect,
                        trust=trusted, replay=options,
                        progress=(lambda c: progress({"check": c.to_dict()})) if progress
                        else None)
    except VerifierError as exc:
        if stream:
            _stream_line({"error": {"message": exc.message,
                                    "exit_code": error_exit_code(exc)}})
        else:
            render.error(exc.message)
        raise typer.Exit(error_exit_code(exc)) from None
    if stream:
        code = exit_code(report)
        _stream_line({"done": {"ok": report.ok, "summary": report.summary(), "exit_code": code,
                               "target": report.target, "named": report.named}})
        raise typer.Exit(code)
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


def _stream_line(value: dict[str, Any]) -> None:
    import json

    sys.stdout.write(json.dumps(value, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def _replay_options(count: int, seed: int | None, tasks: tuple[str, ...], device: str,
                    time_limit: float | None, *, quiet: bool, steps: int = 0) -> Any:
    """The replay the auditor asked for; a seed drawn here is printed (stderr) so the same
    sample can be drawn again."""
    import secrets

    from nscas.verifiers.replay.options import ReplayOptions

    if seed is None:
        seed = secrets.randbits(63)
        sys.stderr.write(f"nscas: replay seed {seed} (--replay-seed {seed} draws the same "
                         "answers again)\n")
    if device == "cuda":
        import os

        import torch

        # Deterministic cuBLAS (a training replay's kernels) needs this before CUDA starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if not torch.cuda.is_available():
            render.error("--device cuda: no CUDA device is available here")
            raise typer.Exit(2)
    def shown(arm: str, done: int, total: int) -> None:
        end = "\n" if done == total else ""
        sys.stderr.write(f"\rreplaying {arm}: {done}/{total} answers{end}")
        sys.stderr.flush()

    return ReplayOptions(count=count, seed=seed, tasks=tasks, device=device,
                         time_limit=time_limit, steps=steps,
                         progress=None if quiet or not sys.stderr.isatty() else shown)


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
