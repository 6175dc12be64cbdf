"""What every command shares: how it opens the store, the option types more than one command
declares (``--json``, an ID, a listing's limit), the app factory."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, overload

import typer
from typer.core import TyperGroup

from nscas.cli import completion

if TYPE_CHECKING:
    from nscas.store.reading import StoreReader
    from nscas.store.writer import Store


@dataclass(frozen=True, slots=True, kw_only=True)
class CliState:
    """The global options, set once by the root callback and read by every command."""

    store: Path | None
    """``--store`` / ``$NSCAS_STORE``: a store directory, a directory holding ``.nscas``, or a
    team store's ``store.toml``."""


def finite(value: float) -> float:
    """A typer callback refusing nan and infinities, which no range check catches."""
    if not math.isfinite(value):
        raise typer.BadParameter(f"{value} is not a finite number")
    return value


# Listing limits stop where SQLite's integers and JSON's exact ones do (2^53): a larger one is
# refused as a usage error, not passed on to overflow.
LIMIT_MAX = 2**53

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
IdArgument = Annotated[
    str,
    typer.Argument(metavar="ID", show_default=False, autocompletion=completion.refs,
                   help="A full ID, a ref name, or a unique prefix of at least 8 hex digits."),
]


class CommandGroup(TyperGroup):
    """A group of commands (``nscas``, ``nscas ref``) that, given no arguments and made with
    ``no_args_is_help``, prints its help on stderr and exits 2."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # click would raise its own error for this, a private class: said here instead.
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            typer.echo(ctx.get_help(), err=True)
            raise typer.Exit(2)
        return super().parse_args(ctx, args)


def command_app(**kwargs: Any) -> typer.Typer:
    """A Typer app for one command module, with the settings the root app uses.

    Plain help (no rich markup) keeps ``--help`` fast and identical on and off a terminal;
    exceptions are mapped by the root group, so typer's pretty tracebacks stay off.
    """
    return typer.Typer(cls=CommandGroup, rich_markup_mode=None, add_completion=False,
                       pretty_exceptions_enable=False, **kwargs)


def state(ctx: typer.Context) -> CliState:
    obj = ctx.find_root().obj
    return obj if isinstance(obj, CliState) else CliState(store=None)


@overload
def open_cli_store(ctx: typer.Context, *, readonly: Literal[False] = False) -> Store: ...
@overload
def open_cli_store(ctx: typer.Context, *, readonly: bool) -> StoreReader: ...
def open_cli_store(ctx: typer.Context, *, readonly: bool = False) -> StoreReader:
    """The store named by ``--store``/``$NSCAS_STORE``, else the ``.nscas`` found upwards.

    ``readonly``: a reader, which keeps SQLAlchemy (a fifth of a second to import) unloaded.
    """
    from nscas.store.opening import open_store

    return open_store(state(ctx).store, readonly=readonly)
