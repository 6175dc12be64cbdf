"""What a step needs (declared by its recipe, from its params) and what one machine has.

A recipe declares its needs in the ``nscas.resources`` entry-point group (``train =
"nscas.recipes.train.resources:needs"``): a function of the step's parsed params returning
``Needs``. The group is read here, not from the recipe's module, so a declaration is not part
of the recipe's code identity: it changes where a step runs, never what it computes. A
recipe with none declared needs one CPU core.

The function is called with the step's params and ``inputs``: the bytes of each input whose
size is known (``input_sizes``; those from upstream steps only once those have run), from which
it estimates the disk its run takes (``disk_gb``). The scheduler starts a step only while the
estimates of the running steps and its own fit the store's free disk less a margin
(``store_disk``); one that would not fit even with nothing running fails at once.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nscas.errors import ConfigError
from nscas.objects.digests import Digest
from nscas.store.protocol import ObjectReader

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
    disk_gb: float = 0.0
    """An estimate of the most disk its run takes at once under the store (its work area and
    scratch, a shared copy it may make), in GB; 0: none worth counting, or unknown."""

    def describe(self) -> str:
        """``2 CPU cores, 1 GPU (about 12 GB), about 40 GB of disk``."""
        parts = [f"{self.cores} CPU core{'s' if self.cores != 1 else ''}"]
        if self.gpus:
            memory = f" (about {self.gpu_memory_gb:g} GB each)" if self.gpu_memory_gb else ""
            parts.append(f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}{memory}")
        if self.disk_gb:
            parts.append(f"about {self.disk_gb:.3g} GB of disk")
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


InputSizes = Mapping[str, int]
"""Bytes of a step's inputs by input name (as ``input_sizes`` counts them), where known."""


def needs_of(recipe: str, params: Any, inputs: InputSizes | None = None) -> Needs:
    """What a step of ``recipe`` with these parsed params and inputs (sizes, where known)
    declares it needs."""
    found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=recipe)
    if not found:
        return Needs()
    declare: Callable[[Any, InputSizes], Needs] = next(iter(found)).load()
    needs = declare(params, inputs or {})
    if not isinstance(needs, Needs):
        raise ConfigError("resources", f"recipe {recipe!r} declares {needs!r}, not a Needs")
    return needs


def input_sizes(store: ObjectReader, inputs: Mapping[str, Digest]) -> dict[str, int]:
    """The bytes each input would take as files: a tree/1's or a record's ``files`` tree's
    files (a checkpoint/1), a record's ``records`` blob (a tasks/1), else the object's own."""
    out = {}
    for name, oid in inputs.items():
        info = store.info(oid)
        if info.kind is None:
            out[name] = info.size
            continue
        record = store.get_record(oid)
        if info.kind != "tree/1" and isinstance(record.get("files"), str):
            record = store.get_record(Digest.parse(record["files"]))
        if record.get("nscas") == "tree/1":
            out[name] = sum(int(e["size"]) for e in record["entries"].values())
        elif isinstance(record.get("records"), str):
            out[name] = store.info(Digest.parse(record["records"])).size
        else:
            out[name] = info.size
    return out


DISK_MARGIN = 0.02
"""The share of the store's file system no step may count on (at least 1 GB): room for the
store's own writes (objects, logs) beside the steps' estimates."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Disk:
    """The disk steps may take under the store: what is free now, less the margin."""

    usable_gb: float
    free_gb: float

    def never_fits(self, needs: Needs) -> str | None:
        """Why a step of ``needs`` could not start even with no other step running; else None."""
        if needs.disk_gb <= self.usable_gb:
            return None
        return (f"it needs {needs.describe()}; the store's disk has {self.free_gb:.3g} GB free, "
                f"{self.usable_gb:.3g} GB of it usable beside the margin (short of "
                f"{needs.disk_gb - self.usable_gb:.3g} GB of disk)")

    def fits(self, needs: Needs, running: Iterable[Needs]) -> bool:
        """Whether a step of ``needs`` fits beside the ``running`` steps' estimates."""
        return needs.disk_gb <= 0 or sum(n.disk_gb for n in running) + needs.disk_gb <= \
            self.usable_gb


def store_disk(root: Path) -> Disk:
    """What the file system of the store at ``root`` has free, and what of it steps may use."""
    usage = shutil.disk_usage(root)
    margin = max(1e9, DISK_MARGIN * usage.total)
    return Disk(usable_gb=max(0.0, usage.free - margin) / 1e9, free_gb=usage.free / 1e9)


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
