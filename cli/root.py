"""The ``nscas`` typer app: global options, the command registry, and the one error mapping.

Commands are imported only when they run (or when their own ``--help`` is asked for), so
``nscas --help`` loads neither the store (SQLAlchemy) nor any recipe (torch). The ``nscas``
script enters through nscas.cli.main, which runs the read commands nscas.cli.fast parses
without importing typer at all, and everything else here.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

# typer carries its own click; its usage errors are these classes (typer is pinned <0.29).
from typer._click.exceptions import NoArgsIsHelpError, UsageError
from typer.core import TyperCommand, TyperGroup

from nscas import __version__
from nscas.cli import render
from nscas.cli.common import CliState
from nscas.errors import NscasError


@dataclass(frozen=True, slots=True, kw_only=True)
class Lazy:
    """Where a command lives; its module defines ``app``, a Typer app with one command or a group."""

    module: str
    """Module name under ``nscas.cli``."""
    summary: str
    """The line ``nscas --help`` shows, so listing commands imports none of them."""


# One line per command; the order here is the order in ``nscas --help``.
COMMANDS: dict[str, Lazy] = {
    "init": Lazy(module="init", summary="Create a store (.nscas) here or in PATH."),
    "add": Lazy(module="add", summary="Store files (blobs) and directories (tree/1 records)."),
    "cat": Lazy(module="cat", summary="Write an object's bytes to stdout, checked against its ID."),
    "get": Lazy(module="get", summary="Write a blob to a file, a tree/1 or checkpoint to a new directory."),
    "show": Lazy(module="show", summary="Show an object: its metadata, record and links."),
    "log": Lazy(module="log", summary="List records, newest first."),
    "ref": Lazy(module="ref", summary="Set, list and trace refs (names for IDs)."),
    "lineage": Lazy(module="lineage", summary="What an object was made from, or what was made from it."),
    "compare": Lazy(module="compare", summary="Compare runs: differing params and headline claims, one row per run."),
    "fsck": Lazy(module="fsck", summary="Check the store; exit 1 if anything is wrong."),
    "gc": Lazy(module="gc", summary="Remove objects no ref or receipt reaches."),
    "run": Lazy(module="run", summary="Run a recipe or pipeline file, reusing cached receipts."),
    "verify": Lazy(module="verify", summary="Independently recheck a receipt, ref or bundle."),
    "export": Lazy(module="export", summary="Write a receipt's closure as an offline SHA256SUMS bundle."),
    "key": Lazy(module="key", summary="Make a signing key pair (ECDSA P-256)."),
    "sign": Lazy(module="sign", summary="Sign a receipt (or the run that produced an output)."),
    "remote": Lazy(module="remote", summary="Name other stores to push to and pull from."),
    "push": Lazy(module="push", summary="Send an object's closure (and its ref) to a remote store."),
    "pull": Lazy(module="pull", summary="Bring an object's closure (and its ref) from a remote store."),
    "import": Lazy(module="import_bundle", summary="Import a bundle into the store, same IDs."),
    "import-hf": Lazy(module="import_hf", summary="Import a Hugging Face model directory as a checkpoint."),
    "import-gguf": Lazy(module="import_gguf", summary="Import a GGUF file and convert it to an FP32 checkpoint."),
    "serve-model": Lazy(module="serve_model", summary="Serve a stored model over HTTP (loopback by default)."),
    "ui": Lazy(module="ui", summary="Browse the store in a web browser (read-only, loopback by default)."),
}


def load_command(name: str) -> Any:
    """The click command of a registered command, importing its module now."""
    module = importlib.import_module(f"nscas.cli.{COMMANDS[name].module}")
    command = typer.main.get_command(module.app)
    command.name = name
    return command


class _LazyCommand(TyperCommand):
    """Stands in for a registered command until it is invoked or its help is asked for."""

    def __init__(self, name: str, summary: str) -> None:
        super().__init__(name, help=summary, short_help=summary, rich_markup_mode=None)

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None,
                     **extra: Any) -> Any:
        # The real command's context: the group then invokes ``sub_ctx.command``, the real one.
        return load_command(self.name or "").make_context(info_name, args, parent=parent, **extra)


class _Group(TyperGroup):
    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, lazy in COMMANDS.items():
            self.commands.setdefault(name, _LazyCommand(name, lazy.summary))

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # click's own usage errors take three lines (usage, hint, error); ours take one, like
        # every other error, with the hint at its end. Exit code 2 either way.
        standalone = kwargs.pop("standalone_mode", True)
        try:
            result = super().main(*args, standalone_mode=False, **kwargs)
        except NoArgsIsHelpError as exc:  # plain ``nscas``: the help, on stderr, exit 2
            if not standalone:
                raise
            exc.show()
            sys.exit(exc.exit_code)
        except UsageError as exc:
            if not standalone:
                raise
            hint = ""
            if exc.ctx is not None:
                hint = f" (try '{exc.ctx.command_path} {exc.ctx.help_option_names[0]}')"
            render.error(" ".join(exc.format_message().split()) + hint)
            sys.exit(exc.exit_code)
        except typer.Abort:
            if not standalone:
                raise
            render.error("aborted")
            sys.exit(1)
        except OSError as exc:
            if not standalone or exc.errno != errno.EPIPE:
                raise
            # a closed pipe (``nscas cat ID | head``): quiet, as click is in standalone mode
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - kept open until exit
            sys.exit(1)
        if not standalone:
            return result
        sys.exit(result if isinstance(result, int) else 0)

    def invoke(self, ctx: Any) -> Any:
        # The one place library errors become messages and exit codes (STYLE 6).
        try:
            return super().invoke(ctx)
        except (NscasError, OSError) as exc:
            code = render.failure(exc)
            if code is None:
                raise  # typer quietens a closed pipe (``nscas cat ID | head``)
            raise typer.Exit(code) from None


app = typer.Typer(
    cls=_Group,
    name="nscas",
    help="nscas: a reproducibility-first, content-addressed artifact store.\n\n"
         "Example: nscas init && nscas add model/ --ref experiments/base",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (typer's, for bash, zsh, fish)
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        render.text(f"nscas {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    store: Annotated[Path | None, typer.Option(
        "--store", envvar="NSCAS_STORE", show_default=False,
        help="The store: a .nscas directory, one holding it, or a team store's store.toml "
             "(default: search upwards).")] = None,
    version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_version, help="Print the version and exit.")] = False,
) -> None:
    ctx.obj = CliState(store=store)
