"""The ``nscas`` script's entry point: the typer app of nscas.cli.root."""

from __future__ import annotations

from collections.abc import Sequence


def app(*, prog_name: str = "nscas", args: Sequence[str] | None = None) -> None:
    """``nscas ARGS`` (default: the process's arguments); exits with the command's code."""
    from nscas.cli.root import app as typer_app

    # The process's own command line: nothing runs after it, so a read command may end it.
    typer_app(prog_name=prog_name, args=None if args is None else list(args),
              ends_process=args is None)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
