"""``log``, ``show`` and ``lineage`` run without typer: parsed here by argparse, run by
nscas.cli.reads.

Importing typer (and the click inside it) is a large part of a read command's start-up, and a
whole ``nscas log`` may take 0.2 s. This parser accepts a subset of what the typer app accepts
and means the same by it: long options with a space or ``=``, ``-n 5`` and ``-n5``, options
before or after ID, an option given twice (the last wins).
Whatever it does not accept goes to the typer app, which parses it again and runs it or says
what is wrong: ``--help``, ``--version``, completion, a misspelt option, a value out of range,
``--``, an ID starting with ``-``. So usage errors and help have one source, and this module
only ever runs invocations typer would run the same way (tests/cli/test_fast.py checks it
against click's own parse, option by option and on generated command lines).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nscas.errors import NscasError

if TYPE_CHECKING:
    import argparse

STORE_ENV = "NSCAS_STORE"
# Listing limits stop where SQLite's integers and JSON's exact ones do (2^53): a larger one is
# refused as a usage error, not passed on to overflow. The typer commands declare the same.
LIMIT_MAX = 2**53
LINEAGE_MAX_NODES = 1_000_000  # --max-nodes' ceiling
LINEAGE_FORMATS = ("tree", "json", "dot")  # --format
_COMPLETE_ENV = "_NSCAS_COMPLETE"  # set while a shell asks typer for completions


class _Refused(Exception):
    """argparse found the command line wrong: the typer app says how."""


@cache
def _parser_class() -> type[argparse.ArgumentParser]:
    # argparse (with the gettext and locale it imports) loads here, once a team store's
    # connection has started (run): while the connection is made, not before it starts.
    import argparse

    def formatter(prog: str) -> argparse.HelpFormatter:
        # add_argument formats each option once as a check; a fixed width spares it importing
        # shutil for the terminal's. This parser never prints help: typer does.
        return argparse.HelpFormatter(prog, width=100)

    class Parser(argparse.ArgumentParser):
        def __init__(self, prog: str) -> None:
            super().__init__(prog=prog, add_help=False, allow_abbrev=False,
                             formatter_class=formatter)

        def error(self, message: str) -> Any:  # argparse would print usage and exit
            raise _Refused(message)

    return Parser


def _parser(prog: str) -> argparse.ArgumentParser:
    return _parser_class()(prog)


def _int_in(low: int, high: int | None) -> Callable[[str], int]:
    """click's ``IntRange(low, high)``: ``int()`` of the text, inside the range."""
    def convert(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            raise ValueError(text)
        return value
    return convert


def _log() -> argparse.ArgumentParser:
    p = _parser("nscas log")
    p.add_argument("--kind")
    p.add_argument("--limit", "-n", type=_int_in(1, LIMIT_MAX), default=20)
    p.add_argument("--json", dest="as_json", action="store_true")
    return p


def _show() -> argparse.ArgumentParser:
    p = _parser("nscas show")
    p.add_argument("id_")
    p.add_argument("--json", dest="as_json", action="store_true")
    return p


def _lineage() -> argparse.ArgumentParser:
    from nscas.store.lineage import (
        MAX_NODES,  # only here: log and show need none of nscas.store.lineage
    )

    p = _parser("nscas lineage")
    p.add_argument("id_")
    p.add_argument("--up", dest="up", action="store_true", default=True)
    p.add_argument("--down", dest="up", action="store_false")
    p.add_argument("--depth", type=_int_in(0, None), default=None)
    p.add_argument("--hide", default="")
    p.add_argument("--max-nodes", type=_int_in(1, LINEAGE_MAX_NODES), default=MAX_NODES)
    p.add_argument("--format", dest="fmt", choices=LINEAGE_FORMATS, default="tree")
    p.add_argument("--json", dest="as_json", action="store_true")
    return p


COMMANDS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "log": _log, "show": _show, "lineage": _lineage}
"""The commands run here, each with its parser; nscas.cli.reads has a function of each name."""


def _scan(argv: Sequence[str], environ: Mapping[str, str]
          ) -> tuple[str, Path | None, Sequence[str]] | None:
    """The command's name, ``--store`` and the command's arguments, if the command is one of
    :data:`COMMANDS` and the root's options are ones this module knows; else None."""
    if _COMPLETE_ENV in environ:
        return None
    store = environ.get(STORE_ENV)
    i = 0
    # The root's options come before the command's name, as the typer group has them.
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] == "--store" and i + 1 < len(argv):
            store, i = argv[i + 1], i + 2
        elif argv[i].startswith("--store="):
            store, i = argv[i].removeprefix("--store="), i + 1
        else:
            return None
    if i == len(argv) or argv[i] not in COMMANDS or store == "":
        return None
    return argv[i], None if store is None else Path(store), argv[i + 1:]


def _options(name: str, args: Sequence[str]) -> dict[str, Any] | None:
    """The options of ``nscas NAME ARGS``, or None where the typer app is to parse them."""
    if "--" in args:
        return None
    try:
        params = vars(COMMANDS[name]().parse_args(args))
    except _Refused:
        return None
    if str(params.get("id_", "")).startswith("-"):
        return None  # click reads it as an option it does not know
    return params


def parse(argv: Sequence[str], environ: Mapping[str, str]
          ) -> tuple[Callable[..., None], Path | None, dict[str, Any]] | None:
    """What to run for ``nscas ARGV``: the command, ``--store``, its options; None: the
    typer app's to run."""
    line = _scan(argv, environ)
    params = None if line is None else _options(line[0], line[2])
    if line is None or params is None:
        return None
    from nscas.cli import reads

    return getattr(reads, line[0]), line[1], params


def run(argv: Sequence[str], environ: Mapping[str, str]) -> int | None:
    """Run ``nscas ARGV`` if :func:`parse` takes it: its exit code. None: it did not."""
    line = _scan(argv, environ)
    if line is None:
        return None
    name, store, args = line
    params = _options(name, args)
    if params is None:
        return None
    from nscas.cli import reads, render

    try:
        getattr(reads, name)(store, **params)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except (NscasError, OSError) as exc:
        code = render.failure(exc)
        if code is not None:
            return code
        # a closed pipe (``nscas log | head``): quiet, exit 1, as the typer app does
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - kept open until exit
        return 1
    except KeyboardInterrupt:
        render.error("aborted")
        return 1
    return 0
