"""Checkpoints on disk: an HF model directory plus the optimizer and RNG state for resuming.

Layout under a run's output directory::

    run.json                          which run this directory belongs to (its identity)
    checkpoints/step-000064/hf/       save_hf_dir: config, model.safetensors, tokenizer files
    checkpoints/step-000064/state.pt  torch.save: optimizer state, every rank's RNG, step
    checkpoints/step-000064/state/    publish_state steps only: the same optimizer and torch
                                      RNG state as optimizer.safetensors and state.json
                                      (docs/format.md §3.3), for a verifier to replay from

    committed.json                    the train recipe's: each checkpoint it has stored, by
                                      step (``record_committed``), so that what is stored can
                                      leave the directory (``trim``)

A checkpoint is written under a ``.partial-`` name, fsync'ed and renamed, so a directory
named ``step-*`` is always complete; partial ones are removed before a resume. A resume needs
only the latest complete checkpoint (its ``hf/`` and ``state.pt``), so at most one resume state
is kept: once a checkpoint is complete the earlier ones' ``state.pt`` go, and the final step's
checkpoint has none (nothing resumes a finished run). ``trim`` removes the earlier checkpoints
once they are stored, and a stored checkpoint's ``state/``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rfc8785
import torch

from nscas.errors import DestinationExists, RecipeError
from nscas.objects.durable import fsync_dir, fsync_file, fsync_tree
from nscas.recipes.init.presets import save_hf_dir

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STATE_FORMAT = "train-state/1"
PUBLISHED_FORMAT = "nscas-train-state/1"
"""The ``format`` of a published state's ``state.json``."""
PUBLISHED_TENSORS = "optimizer.safetensors"
PUBLISHED_RECORD = "state.json"
RUN_FORMAT = "train-run/1"
COMMITTED_FORMAT = "train-committed/1"
COMMITTED_FILE = "committed.json"
_STEP_DIR = re.compile(r"step-(\d{6})")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointPaths:
    """Where one complete checkpoint lies."""

    step: int
    """Updates made before it was written."""
    hf_dir: Path
    """The HF model directory (what becomes a ``checkpoint/1``)."""
    state_file: Path
    """Optimizer and RNG state, for resuming only (absent at the final step, and from a
    checkpoint once a later one is complete)."""


def checkpoint_root(output_dir: Path) -> Path:
    return Path(output_dir) / "checkpoints"


def paths_for(output_dir: Path, step: int) -> CheckpointPaths:
    base = checkpoint_root(output_dir) / f"step-{step:06d}"
    return CheckpointPaths(step=step, hf_dir=base / "hf", state_file=base / "state.pt")


def completed_checkpoints(output_dir: Path) -> list[CheckpointPaths]:
    """Every complete checkpoint in ``output_dir``, by step."""
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    steps = sorted(int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)))
    return [paths_for(output_dir, s) for s in steps]


def discard_partial(output_dir: Path) -> None:
    """Remove checkpoints whose writing or removal was interrupted (only this module makes
    them)."""
    root = checkpoint_root(output_dir)
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith((".partial-", ".trash-")):
                shutil.rmtree(path)


def write_checkpoint(
    output_dir: Path,
    step: int,
    *,
    model: PreTrainedModel,
    tokenizer_dir: Path,
    state: dict[str, Any] | None,
    published: tuple[dict[str, torch.Tensor], dict[str, Any]] | None = None,
) -> CheckpointPaths:
    """Write the model as an HF directory and ``state`` (plus format and step; None: no resume
    state, the final step's) atomically, ``published`` (``published_state``) also as
    ``state/``; then remove the earlier checkpoints' resume states, which no resume reads now."""
    final = paths_for(output_dir, step)
    if final.hf_dir.parent.exists():
        raise DestinationExists(str(final.hf_dir.parent))
    partial = checkpoint_root(output_dir) / f".partial-step-{step:06d}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    save_hf_dir(model, Path(tokenizer_dir), partial / "hf", trained=True)
    if state is not None:
        torch.save({"format": STATE_FORMAT, "step": step, **state}, partial / "state.pt")
    if published is not None:
        write_published(partial / "state", *published)
    fsync_tree(partial)
    os.rename(partial, final.hf_dir.parent)
    fsync_dir(checkpoint_root(output_dir))
    for earlier in completed_checkpoints(output_dir):
        if earlier.step < step:
            # The recipe may be removing the whole directory meanwhile (trim): gone either way.
            earlier.state_file.unlink(missing_ok=True)
    return final


def published_paths(paths: CheckpointPaths) -> Path:
    """The ``state/`` directory of a checkpoint (present for ``publish_state`` steps only)."""
    return paths.state_file.parent / "state"


def published_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, rng: list[dict[str, Any]], *,
    step: int, world: int,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The optimizer state and every rank's torch RNG state as named tensors, and the JSON
    record beside them (docs/format.md §3.3): the state dict's parameter indices become the
    parameters' names, so nothing needs the pickle to read it. Python's ``random`` is not
    published: the loop draws nothing from it (the schedule has its own seeded generator)."""
    names = {id(p): n for n, p in model.named_parameters()}
    saved = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    groups = []
    index = 0
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"], strict=True):
        members = []
        for param in group["params"]:
            name = names[id(param)]
            members.append(name)
            for key, value in saved["state"].get(index, {}).items():
                tensors[f"{key}/{name}"] = value.detach().to("cpu").contiguous()
            index += 1
        groups.append({"params": members, "lr": saved_group["lr"],
                       "weight_decay": saved_group["weight_decay"]})
    for rank, states in enumerate(rng):
        for kind in ("torch", "cuda"):
            if kind in states:
                tensors[f"rng/{rank}/{kind}"] = states[kind].detach().to("cpu").contiguous()
    record = {"format": PUBLISHED_FORMAT, "step": step, "world": world, "groups": groups}
    return tensors, record


def write_published(directory: Path, tensors: dict[str, torch.Tensor],
                    record: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    directory.mkdir()
    save_file(tensors, str(directory / PUBLISHED_TENSORS))
    (directory / PUBLISHED_RECORD).write_bytes(rfc8785.dumps(record))


def read_state(paths: CheckpointPaths, *, device: torch.device) -> dict[str, Any]:
    """The resume state of a checkpoint, tensors on ``device``."""
    try:
        state = torch.load(paths.state_file, map_location=device, weights_only=True)
    except (OSError, RuntimeError, ValueError) as exc:
        raise RecipeError(f"cannot read checkpoint state {paths.state_file}: {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT or state.get(
        "step"
    ) != paths.step:
        raise RecipeError(f"{paths.state_file} is not the {STATE_FORMAT} state of step {paths.step}")
    return state


def claim_output_dir(output_dir: Path, identity: str) -> bool:
    """Mark ``output_dir`` as the home of run ``identity``; True if it already was (a resume).

    A directory holding another run's files is refused: resuming it would mix two runs.
    """
    output_dir = Path(output_dir)
    marker = output_dir / "run.json"
    if marker.exists():
        try:
            held = json.loads(marker.read_text(encoding="utf-8")).get("identity")
        except (OSError, ValueError, AttributeError) as exc:
            raise RecipeError(f"cannot read {marker}: {exc}") from exc
        if held != identity:
            raise RecipeError(
                f"output directory {output_dir} holds another run ({held}, not {identity}); "
                "give each run its own directory"
            )
        return True
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps({"format": RUN_FORMAT, "identity": identity}) + "\n")
    fsync_file(tmp)
    os.rename(tmp, marker)
    return False


def run_identity(values: dict[str, Any], files: list[Path]) -> str:
    """SHA-256 hex naming a run: canonical JSON of ``values`` plus each file's SHA-256."""
    hashes = []
    for path in files:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        hashes.append(digest.hexdigest())
    return hashlib.sha256(rfc8785.dumps({"values": values, "files": hashes})).hexdigest()


def read_committed(output_dir: Path) -> dict[int, str]:
    """The checkpoints a run has stored, by step (object IDs as text); empty for a new run."""
    path = Path(output_dir) / COMMITTED_FILE
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("format") != COMMITTED_FORMAT:
            raise ValueError(f"format is {raw.get('format')!r}, not {COMMITTED_FORMAT}")
        return {int(step): str(oid) for step, oid in raw["checkpoints"].items()}
    except (OSError, ValueError, AttributeError, KeyError, TypeError) as exc:
        raise RecipeError(f"cannot read {path}: {exc}") from exc


def record_committed(output_dir: Path, step: int, oid: str) -> None:
    """Add ``step``'s stored checkpoint to ``committed.json`` (atomically, fsync'ed)."""
    done = read_committed(output_dir)
    done[step] = oid
    path = Path(output_dir) / COMMITTED_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(rfc8785.dumps({"format": COMMITTED_FORMAT,
                                   "checkpoints": {str(s): done[s] for s in sorted(done)}}))
    fsync_file(tmp)
    os.rename(tmp, path)
    fsync_dir(Path(output_dir))


def await_stored(output_dir: Path, steps: Iterable[int], *, timeout: float) -> None:
    """Return once ``committed.json`` lists every one of ``steps`` (the recipe stores each
    checkpoint announced to it, then records it there); ``RecipeError`` after ``timeout``
    seconds. The recipe is another process, and a rank has no channel from it but this file."""
    wanted = set(steps)
    deadline = time.monotonic() + timeout
    pause = 0.01
    while not wanted <= read_committed(output_dir).keys():
        if time.monotonic() > deadline:
            missing = sorted(wanted - read_committed(output_dir).keys())
            raise RecipeError(f"checkpoints at steps {missing} were not stored within "
                              f"{timeout:g} s (checkpoint_timeout_seconds)")
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


def trim(output_dir: Path, *, latest: int) -> None:
    """Remove every stored (``committed.json``) checkpoint before step ``latest``: a resume
    starts from the latest complete one; and, once ``latest`` is stored, its published
    ``state/`` (a resume reads ``state.pt``). A checkpoint not yet stored is kept whole."""
    stored = read_committed(output_dir)
    for paths in completed_checkpoints(output_dir):
        if paths.step not in stored or paths.step > latest:
            continue
        if paths.step < latest:
            # Renamed first: a crash mid-removal leaves a .trash- name, never a step-* one.
            trash = paths.hf_dir.parent.with_name(f".trash-{paths.hf_dir.parent.name}")
            os.rename(paths.hf_dir.parent, trash)
            shutil.rmtree(trash)
        else:
            shutil.rmtree(published_paths(paths), ignore_errors=True)
    fsync_dir(checkpoint_root(output_dir))
