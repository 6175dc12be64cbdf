"""The ``nscas`` typer app: global options, the command registry, and the one error mapping.

Commands are imported only when they run (or when their own ``--help`` is asked for), so
``nscas --help`` loads neither the store (SQLAlchemy) nor any recipe (torch), and a command
loads only its own module. Each command is declared once, in its module, for typer.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

from nscas import __version__
from nscas.cli import render
from nscas.cli.common import CliState, CommandGroup
from nscas.errors import NscasError


@dataclass(frozen=True, slots=True, kw_only=True)
class Lazy:
    """Where a command lives; its module defines ``app``, a Typer app with one command or a group."""

    module: str
    """Module name under ``nscas.cli``."""
    summary: str
    """The line ``nscas --help`` shows, so listing commands imports none of them."""
    only_reads: bool = False
    """Leaves nothing to finish when it returns (no file written, its store closed): run as the
    process's own command line, it ends the process at once (:func:`end`)."""


# One line per command; the order here is the order in ``nscas --help``.
COMMANDS: dict[str, Lazy] = {
    "init": Lazy(module="init", summary="Create a store (.nscas) here or in PATH."),
    "add": Lazy(module="add", summary="Store files (blobs) and directories (tree/1 records)."),
    "cat": Lazy(module="cat", summary="Write an object's bytes to stdout, checked against its ID."),
    "get": Lazy(module="get", summary="Write a blob to a file, a tree/1 or checkpoint to a new directory."),
    "show": Lazy(module="show", summary="Show an object: its metadata, record and links.", only_reads=True),
    "du": Lazy(module="du", summary="Show objects' raw and stored bytes (codecs, deltas).", only_reads=True),
    "log": Lazy(module="log", summary="List records, newest first.", only_reads=True),
    "ref": Lazy(module="ref", summary="Set, list and trace refs (names for IDs)."),
    "lineage": Lazy(module="lineage", summary="What an object was made from, or what was made from it.", only_reads=True),
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


def end(code: int) -> NoReturn:
    """End the process now, its output flushed. A read command has nothing left to finish,
    and finalizing the interpreter (tearing down every module, the exit handlers of OpenSSL
    and the other libraries a team store's driver loads) is a large part of its time
    (docs/benchmarks.md §9)."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):  # a pipe closed meanwhile: what was lost is lost
            stream.flush()
    os._exit(code)


class _Group(CommandGroup):
    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for name, lazy in COMMANDS.items():
            self.commands.setdefault(name, _LazyCommand(name, lazy.summary))
        self.ends_process = False

    def main(self, *args: Any, ends_process: bool = False, **kwargs: Any) -> Any:
        """click's ``main``; ``ends_process``: this is the process's own command line, and a
        command that only reads ends it at once (:func:`end`)."""
        self.ends_process = ends_process
        # click's own errors (usage errors among them: exit 2) derive from typer's public
        # TyperException. They take one line here, like every other error, a usage error's
        # hint at its end, not click's three (usage, hint, error).
        standalone = kwargs.get("standalone_mode", True)
        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except typer.TyperException as exc:
            if not standalone:
                raise
            hint = ""
            context = getattr(exc, "ctx", None)  # a usage error's: the command it was for
            if context is not None:
                hint = f" (try '{context.command_path} {context.help_option_names[0]}')"
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
            result = super().invoke(ctx)
            if self._ends(ctx):
                sys.stdout.flush()  # a closed pipe shows here, as the error below, not at the end
        except (NscasError, OSError) as exc:
            code = render.failure(exc)
            if code is None:
                raise  # typer quietens a closed pipe (``nscas cat ID | head``)
            if self._ends(ctx):
                end(code)
            raise typer.Exit(code) from None
        if self._ends(ctx):
            end(0)
        return result

    def _ends(self, ctx: Any) -> bool:
        """Whether the command just run ends the process at once (:func:`end`)."""
        lazy = COMMANDS.get(ctx.invoked_subcommand or "")
        return self.ends_process and lazy is not None and lazy.only_reads


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
