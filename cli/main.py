"""The ``nscas`` script's entry point: ``app`` runs the read commands nscas.cli.fast parses,
without importing typer, and hands everything else to the typer app (nscas.cli.root)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def app(*, prog_name: str = "nscas", args: Sequence[str] | None = None) -> None:
    """``nscas ARGS`` (default: the process's arguments); exits with the command's code."""
    from nscas.cli import fast

    argv = list(sys.argv[1:] if args is None else args)
    code = fast.run(argv, os.environ)
    if code is not None:
        sys.exit(code)
    from nscas.cli.root import app as typer_app

    typer_app(prog_name=prog_name, args=argv)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
