"""``nscas import-hf``: store an existing Hugging Face model directory as a checkpoint/1."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nscas.cli import render
from nscas.cli.common import JsonFlag, command_app, open_cli_store
from nscas.errors import InvalidInput
from nscas.models.checkpoints import put_checkpoint

if TYPE_CHECKING:
    from nscas.objects.digests import Digest
    from nscas.store.writer import Store

app = command_app()

SOURCE = "import-hf"
"""The checkpoint's ``source`` member: where a checkpoint without a producing run came from."""
_OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")


@dataclass(frozen=True, slots=True, kw_only=True)
class Imported:
    checkpoint: Digest
    params: Digest
    """The parameter digest (docs/format.md §4)."""
    files: Digest
    """The tree/1 of the directory as stored."""
    model_type: str
    """``model_type`` of its config.json."""


def check_hf_dir(directory: Path) -> str:
    """The ``model_type`` of a Hugging Face model directory; InvalidInput if it is not one."""
    if not directory.is_dir():
        raise InvalidInput(f"{directory} is not a directory")
    config = directory / "config.json"
    if not config.is_file():
        raise InvalidInput(f"{directory} has no config.json; not a Hugging Face model directory")
    try:
        value = json.loads(config.read_bytes())
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidInput(f"{config} is broken: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise InvalidInput(f"{config} is broken: expected a JSON object")
    model_type = value.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InvalidInput(f"{config} is broken: it has no 'model_type' string")
    weights = sorted(directory.glob("*.safetensors"))
    if not weights:
        other = sorted(p.name for p in directory.iterdir() if p.suffix in _OTHER_WEIGHTS)
        hint = (f" (found {', '.join(other)}; save it again with safe_serialization=True)"
                if other else "")
        raise InvalidInput(f"{directory} holds no *.safetensors weights{hint}")
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_bytes())["weight_map"].values())
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            raise InvalidInput(f"{index} is broken: expected JSON with a 'weight_map'") from None
        missing = sorted(str(s) for s in shards
                         if not isinstance(s, str) or not (directory / s).is_file())
        if missing:
            raise InvalidInput(f"{index} names weight files that are not there: {missing}")
    return model_type


def import_hf(store: Store, directory: Path) -> Imported:
    """Store ``directory`` as checkpoint/1 (step 0, no parent), after checking it."""
    from nscas.objects.digests import Digest

    model_type = check_hf_dir(directory)
    with _regular_files(directory) as plain:
        checkpoint = put_checkpoint(store, plain, step=0, parent=None, extra={"source": SOURCE})
    record = store.get_record(checkpoint)
    return Imported(checkpoint=checkpoint, params=Digest.parse(record["params"]),
                    files=Digest.parse(record["files"]), model_type=model_type)


@contextmanager
def _regular_files(directory: Path) -> Iterator[Path]:
    """``directory``, or a copy with its file links followed.

    The Hugging Face cache keeps a snapshot as links into a blob folder, and the store takes
    regular files only; links become hard links where the filesystem allows, else copies.
    """
    links = [p for p in directory.rglob("*") if p.is_symlink()]
    if not links:
        yield directory
        return
    bad = [str(p) for p in links if not p.resolve().is_file()]
    if bad:
        raise InvalidInput(f"{directory}: links that do not lead to a regular file: {bad[:5]}")
    tmp = Path(tempfile.mkdtemp(prefix="nscas-import-hf-"))
    try:
        for src in sorted(directory.rglob("*")):
            dst = tmp / src.relative_to(directory)
            if src.is_dir() and not src.is_symlink():
                dst.mkdir(parents=True, exist_ok=True)
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            real = src.resolve()
            try:
                os.link(real, dst)
            except OSError:
                shutil.copyfile(real, dst)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@app.command("import-hf")
def import_hf_command(
    ctx: typer.Context,
    directory: Annotated[Path, typer.Argument(
        metavar="DIR", show_default=False,
        help="A Hugging Face model directory: config.json and *.safetensors weights.")],
    ref: Annotated[str | None, typer.Option(
        "--ref", metavar="NAME", show_default=False,
        help="Point this ref at the new checkpoint.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Store a Hugging Face model directory as a checkpoint (step 0, no parent).

    The directory needs config.json with a model_type and safetensors weights; anything else
    is refused before anything is stored. The checkpoint records source "import-hf".

    Example: nscas import-hf ./SmolLM2-1.7B --ref experiments/coop/base
    """
    from nscas.store.writer import check_ref_name

    if ref is not None:
        check_ref_name(ref)
    check_hf_dir(directory)  # before the store is opened: bad input touches nothing
    with open_cli_store(ctx) as store:
        done = import_hf(store, directory)
        if ref is not None:
            store.ref_set(ref, done.checkpoint, message=f"nscas import-hf {directory}")
    if as_json:
        render.json_out({"checkpoint": str(done.checkpoint), "params": str(done.params),
                         "files": str(done.files), "model_type": done.model_type, "ref": ref})
        return
    render.fields([("checkpoint", str(done.checkpoint)), ("params", str(done.params)),
                   ("files", str(done.files)), ("model_type", done.model_type)])
    if ref is not None:
        render.text(f"{ref} -> {done.checkpoint}")
