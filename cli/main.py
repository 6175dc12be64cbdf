"""The ``nscas`` script's entry point: ``app`` runs the read commands nscas.cli.fast parses,
without importing typer, and hands everything else to the typer app (nscas.cli.root)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from contextlib import suppress
from typing import NoReturn


def app(*, prog_name: str = "nscas", args: Sequence[str] | None = None) -> None:
    """``nscas ARGS`` (default: the process's arguments); exits with the command's code."""
    from nscas.cli import fast

    argv = list(sys.argv[1:] if args is None else args)
    code = fast.run(argv, os.environ)
    if code is not None:
        if args is None:  # the process's own command line: nothing runs after it
            _end(code)
        sys.exit(code)
    from nscas.cli.root import app as typer_app

    typer_app(prog_name=prog_name, args=argv)


def _end(code: int) -> NoReturn:
    """End the process now, its output flushed. A read command has nothing left to finish
    (its connection is closed, it wrote no file), and finalizing the interpreter (tearing
    down every module, the exit handlers of OpenSSL and the other libraries libpq loads) is
    a large part of a read command's time (docs/benchmarks.md §9)."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):  # a pipe closed meanwhile: what was lost is lost
            stream.flush()
    os._exit(code)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
