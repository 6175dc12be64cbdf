"""What a step needs (declared by its recipe, from its params) and what one machine has.

A recipe declares its needs in the ``nscas.resources`` entry-point group (``train =
"nscas.recipes.train.resources:needs"``): a function of the step's parsed params returning
``Needs``. The group is read here, not from the recipe's module, so a declaration is not part
of the recipe's code identity: it changes where a step runs, never what it computes. A
recipe with none declared needs one CPU core.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nscas.errors import ConfigError

ENTRY_POINT_GROUP = "nscas.resources"


@dataclass(frozen=True, slots=True, kw_only=True)
class Needs:
    """What one step asks for while it runs."""

    cores: int = 1
    """CPU cores; the step's thread count follows them (OMP_NUM_THREADS, CPU affinity)."""
    gpus: int = 0
    """Whole GPUs (a world-2 train on CUDA: 2), or, with ``gpu_memory_gb`` and sharing
    allowed, slots of GPUs others may use too."""
    gpu_memory_gb: float = 0.0
    """An estimate of the memory the step takes on each of its GPUs; 0: unknown (the step
    takes its GPUs whole unless the user allows sharing)."""
    world: int = 1
    """The processes (ranks) the step runs; informational: its ``cores`` and ``gpus`` count
    them already."""

    def describe(self) -> str:
        """``2 CPU cores, 1 GPU (about 12 GB)``."""
        parts = [f"{self.cores} CPU core{'s' if self.cores != 1 else ''}"]
        if self.gpus:
            memory = f" (about {self.gpu_memory_gb:g} GB each)" if self.gpu_memory_gb else ""
            parts.append(f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}{memory}")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    index: int
    memory_gb: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """What the scheduler may hand out: CPU cores (by id, as ``os.sched_setaffinity`` takes
    them) and GPUs (by index, as ``CUDA_VISIBLE_DEVICES`` names them)."""

    cores: tuple[int, ...]
    gpus: tuple[Gpu, ...] = ()

    def describe(self) -> str:
        gpus = f", {len(self.gpus)} GPU{'s' if len(self.gpus) != 1 else ''}" if self.gpus else \
            ", no GPU"
        return f"{len(self.cores)} CPU core{'s' if len(self.cores) != 1 else ''}{gpus}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """What one running step was given."""

    cores: tuple[int, ...]
    gpus: tuple[int, ...] = ()
    share: int = 1
    """How many steps at once (this one counted) it let each of its GPUs have."""

    def environment(self, needs: Needs) -> dict[str, str]:
        """The variables a step's process starts with: its GPUs, and its thread count (its
        cores shared among its ranks)."""
        threads = str(max(1, len(self.cores) // max(1, needs.world)))
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpus)),
                "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}

    def describe(self) -> str:
        where = f"cpu {_ranges(self.cores)}"
        return where + (f", gpu {','.join(map(str, self.gpus))}" if self.gpus else "")


def this_machine() -> Machine:
    """The cores this process may run on and the GPUs ``nvidia-smi`` lists (none without it)."""
    cores = tuple(sorted(os.sched_getaffinity(0)))
    return Machine(cores=cores, gpus=tuple(_nvidia_gpus()))


def default_jobs(machine: Machine | None = None) -> int:
    """How many steps a pipeline run starts at once unless told: as many as the machine (by
    default this one) has CPU cores or GPUs, the larger; what each step declares still bounds
    what starts together."""
    machine = machine or this_machine()
    return max(1, len(machine.cores), len(machine.gpus))


def _nvidia_gpus() -> Iterable[Gpu]:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return []
    try:
        out = subprocess.run([tool, "--query-gpu=index,memory.total", "--format=csv,noheader,"
                              "nounits"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.stdout.splitlines():
        index, _, memory = line.partition(",")
        if index.strip().isdigit():
            gpus.append(Gpu(index=int(index), memory_gb=float(memory or 0) / 1024))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:  # the user's own restriction holds for what we hand out
        allowed = {int(v) for v in visible.split(",") if v.strip().isdigit()}
        gpus = [g for g in gpus if g.index in allowed]
    return gpus


def needs_of(recipe: str, params: Any) -> Needs:
    """What a step of ``recipe`` with these parsed params declares it needs."""
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=recipe)
    if not found:
        return Needs()
    declare: Callable[[Any], Needs] = next(iter(found)).load()
    needs = declare(params)
    if not isinstance(needs, Needs):
        raise ConfigError("resources", f"recipe {recipe!r} declares {needs!r}, not a Needs")
    return needs


class Pool:
    """The free part of a machine. ``gpu_share``: how many steps may use one GPU at once
    (1: a GPU is one step's), unless a step says otherwise (its ``share``)."""

    def __init__(self, machine: Machine, *, gpu_share: int = 1) -> None:
        if gpu_share < 1:
            raise ConfigError("--gpu-share", f"must be at least 1, got {gpu_share}")
        self.machine = machine
        self.gpu_share = gpu_share
        self._free_cores = list(machine.cores)
        self._on: dict[int, list[int]] = {g.index: [] for g in machine.gpus}
        """Each GPU's steps now, by the share each allows."""
        self._memory = {g.index: g.memory_gb for g in machine.gpus}

    def never_fits(self, needs: Needs) -> str | None:
        """Why a step with these needs could not run here even on an idle machine; else None."""
        problems = []
        if needs.cores > len(self.machine.cores):
            problems.append(f"{needs.cores} CPU cores")
        if needs.gpus > len(self.machine.gpus):
            problems.append(f"{needs.gpus} GPU{'s' if needs.gpus != 1 else ''}")
        elif needs.gpus and needs.gpu_memory_gb:
            roomy = [g for g in self.machine.gpus if g.memory_gb >= needs.gpu_memory_gb]
            if len(roomy) < needs.gpus:
                problems.append(f"{needs.gpus} GPU(s) of {needs.gpu_memory_gb:g} GB")
        if not problems:
            return None
        return (f"it needs {needs.describe()}; this machine has {self.machine.describe()} "
                f"(short of {' and '.join(problems)})")

    def take(self, needs: Needs, share: int | None = None) -> Grant | None:
        """Hand out what ``needs`` asks for, or None if it is not free now. Cores are given
        whole (a step with more cores than are free waits). A GPU takes a step while it would
        then have no more steps than the least ``share`` among them allows (``share``: this
        step's, default ``gpu_share``); a shared GPU's step must fit its memory estimate in
        what the GPU's other steps left."""
        share = share or self.gpu_share
        cores = min(needs.cores, len(self.machine.cores))
        if cores > len(self._free_cores):
            return None
        chosen: list[int] = []
        for index in sorted(self._on, key=lambda i: (len(self._on[i]), i)):
            if len(chosen) == needs.gpus:
                break
            on = self._on[index]
            fits = len(on) + 1 <= min([share, *on])
            if fits and (share == 1 or self._memory[index] >= needs.gpu_memory_gb):
                chosen.append(index)
        if len(chosen) < needs.gpus:
            return None
        given = tuple(self._free_cores[:cores])
        del self._free_cores[:cores]
        for index in chosen:
            self._on[index].append(share)
            self._memory[index] -= needs.gpu_memory_gb
        return Grant(cores=given, gpus=tuple(sorted(chosen)), share=share)

    def give_back(self, grant: Grant, needs: Needs) -> None:
        self._free_cores = sorted({*self._free_cores, *grant.cores})
        for index in grant.gpus:
            self._on[index].remove(grant.share)
            self._memory[index] += needs.gpu_memory_gb


def _ranges(values: tuple[int, ...]) -> str:
    """``0-3,6``."""
    out: list[str] = []
    for v in values:
        if out and out[-1].split("-")[-1] == str(v - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        else:
            out.append(str(v))
    return ",".join(out)
