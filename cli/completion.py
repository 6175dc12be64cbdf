"""Shell completion of the names a command takes: refs, step names of a run file, kinds.

typer calls these while the shell asks (``_NSCAS_COMPLETE``); the root callback has not run,
so the store is read from ``--store`` as parsed so far, else ``$NSCAS_STORE``, else found
upwards. A completion never fails loudly: where there is no store or no readable file there
is nothing to offer.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from nscas.errors import NscasError


def _store_of(ctx: typer.Context) -> Path | None:
    given = ctx.find_root().params.get("store")  # not always converted to a Path yet
    if isinstance(given, str | Path) and str(given):
        return Path(given)
    env = os.environ.get("NSCAS_STORE")
    return Path(env) if env else None


def refs(ctx: typer.Context, incomplete: str) -> list[str]:
    """The store's ref names that start with ``incomplete``."""
    from nscas.store.opening import open_store

    try:
        with open_store(_store_of(ctx), readonly=True) as reader:
            return [name for name, _ in reader.ref_list(incomplete)]
    except (NscasError, OSError):
        return []


def kinds(incomplete: str) -> list[str]:
    """The record kinds (``receipt/1``, ...) that start with ``incomplete``."""
    from nscas.objects.kinds import KINDS

    return [kind for kind in KINDS if kind.startswith(incomplete)]


def _step_names(ctx: typer.Context) -> list[str]:
    from nscas.runs.plans import load_plan_file

    file = ctx.params.get("file")
    if not isinstance(file, Path):
        # Before an option's value the parse stops short and FILE is left among the args.
        file = next((Path(a) for a in ctx.args if not a.startswith("-") and Path(a).is_file()),
                    None)
    if file is None:
        return []
    try:
        return [step.name for step in load_plan_file(file).steps]
    except (NscasError, OSError):
        return []


def steps(ctx: typer.Context, incomplete: str) -> list[str]:
    """The step names of the run file given so far that start with ``incomplete``."""
    return [name for name in _step_names(ctx) if name.startswith(incomplete)]


def step_params(ctx: typer.Context, incomplete: str) -> list[str]:
    """``STEP.`` for each step of the run file given so far (``--set STEP.PARAM=VALUE``)."""
    return [f"{name}." for name in _step_names(ctx) if f"{name}.".startswith(incomplete)]
