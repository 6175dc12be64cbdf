"""A run's ``environment/1`` record cross-checked against its params and journals (docs/format.md §3).

The record describes the process that ran the recipe: ``python``, ``platform``, ``host``,
``packages`` (distribution versions), ``torch`` (null when the recipe never imported torch,
else ``version``, ``cuda`` — null for a CPU build — and more), ``devices`` (a ``cpu`` entry
and one ``cuda`` entry per visible GPU, with ``index`` and ``memory_bytes``) and
``determinism``. Where another record of the run speaks about the same fact, the two must
agree; every disagreement is one problem of the single check ``<run>.environment``:

- a CUDA device is listed only beside a torch build with CUDA (``torch.cuda`` not null): a
  CPU build sees no GPU;
- a version with a local tag ``+cpu`` is a CPU build (``torch.cuda`` null); ``+cuNNN`` is the
  CUDA build ``torch.cuda`` names (``+cu124`` is ``12.4``);
- ``packages.torch`` is ``torch.version`` (one installed distribution), or its release
  without the local tag: some images install a build whose metadata says ``2.11.0`` while
  ``torch.__version__`` says ``2.11.0+cu130``; two different local tags disagree;
- params ``device`` ``cuda`` or ``cuda:N`` needs a CUDA build and that CUDA device listed;
- for a single-node run on CUDA, the world size (train) or the replicas (serve, one GPU
  each) are at most the CUDA devices listed; on every
  single-node run the ranks' journals name the environment's host; a rank's peak CUDA memory
  is at most its device's memory.

Not cross-checked, and why: the ``determinism`` flags are those of the process that wrote the
record (the runner), while training sets them in its worker processes, so they say nothing
about the workers; thread counts likewise. Those members are self-reported.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

from ..core.results import Check

_CUDA_DEVICE = re.compile(r"^cuda(?::([0-9]{1,4}))?$")
_CU_TAG = re.compile(r"\+cu([0-9]{2,4})$")
_SHOWN = 5


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def environment_problems(env: Any, params: Mapping[str, Any] | None = None,
                         journals: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """Every disagreement between an environment record and the run's params and journal/1
    records (see the module docstring); wrong JSON types are problems too."""
    if not isinstance(env, Mapping):
        return ["the environment is not a JSON object"]
    params = params if isinstance(params, Mapping) else {}
    problems: list[str] = []
    devices = env.get("devices")
    cuda: list[Mapping[str, Any]] = []
    if not isinstance(devices, list) or not all(
            isinstance(d, Mapping) and isinstance(d.get("type"), str) for d in devices):
        problems.append("devices is not a list of objects with a string type")
    else:
        cuda = [d for d in devices if d["type"] == "cuda"]
        indices = [d.get("index") for d in cuda]
        if not all(_is_int(i) and i >= 0 for i in indices) or len(set(indices)) != len(indices):
            problems.append("the CUDA devices do not carry distinct integer indices")
    torch = env.get("torch")
    build_cuda: Any = None
    version: Any = None
    if torch is not None and not isinstance(torch, Mapping):
        problems.append("torch is neither null nor an object")
        torch = None
    if torch is not None:
        version, build_cuda = torch.get("version"), torch.get("cuda")
        if not isinstance(version, str):
            problems.append("torch.version is not a string")
        if build_cuda is not None and not isinstance(build_cuda, str):
            problems.append("torch.cuda is neither null nor a string")
    if cuda and (torch is None or build_cuda is None):
        problems.append(f"{len(cuda)} CUDA device(s) listed beside "
                        + ("no torch" if torch is None else "a CPU build of torch (torch.cuda "
                                                            "is null)"))
    if isinstance(version, str):
        if version.endswith("+cpu") and build_cuda is not None:
            problems.append(f"torch {version} is a CPU build but torch.cuda is {build_cuda!r}")
        tag = _CU_TAG.search(version)
        if tag and isinstance(build_cuda, str) and build_cuda.replace(".", "") != tag.group(1):
            problems.append(f"torch {version} is built for CUDA {tag.group(1)}, torch.cuda says "
                            f"{build_cuda!r}")
        if tag and build_cuda is None:
            problems.append(f"torch {version} is a CUDA build but torch.cuda is null")
    packages = env.get("packages")
    if packages is not None and not isinstance(packages, Mapping):
        problems.append("packages is not an object")
    elif (isinstance(packages, Mapping) and torch is not None and isinstance(version, str)
          and not _same_build(packages.get("torch"), version)):
        problems.append(f"packages.torch is {packages.get('torch')!r}, torch.version is "
                            f"{version!r}")
    problems += _device_problems(params, cuda, torch, build_cuda)
    problems += _journal_problems(env, params, cuda, journals)
    return problems


def _device_problems(params: Mapping[str, Any], cuda: list[Mapping[str, Any]], torch: Any,
                     build_cuda: Any) -> list[str]:
    device = params.get("device")
    if device is None:
        return []
    if not isinstance(device, str):
        return [f"params device {device!r} is not a string"]
    match = _CUDA_DEVICE.match(device)
    if match is None:
        return []
    problems = []
    if torch is None or build_cuda is None:
        problems.append(f"params device {device!r} but the environment has no CUDA build of "
                        "torch")
    if not cuda:
        problems.append(f"params device {device!r} but no CUDA device is listed")
    elif match.group(1) is not None and int(match.group(1)) not in [d.get("index")
                                                                    for d in cuda]:
        problems.append(f"params device {device!r} but CUDA device {match.group(1)} is not "
                        "listed")
    # One GPU per rank (train) or per replica (serve), on one node.
    for what in ("world", "replicas"):
        count, nodes = params.get(what), params.get("nnodes", 1)
        if _is_int(count) and nodes == 1 and cuda and count > len(cuda):
            problems.append(f"params {what} {count} on CUDA, but only {len(cuda)} CUDA "
                            "device(s) are listed")
    return problems


def _journal_problems(env: Mapping[str, Any], params: Mapping[str, Any],
                      cuda: list[Mapping[str, Any]],
                      journals: Sequence[object]) -> list[str]:
    problems = []
    single_node = params.get("nnodes", 1) == 1
    host = env.get("host")
    device = params.get("device")
    on_cuda = isinstance(device, str) and _CUDA_DEVICE.match(device) is not None
    memory = [d.get("memory_bytes") for d in cuda]
    sizes = [m for m in memory if _is_int(m)]
    for record in journals:
        if not isinstance(record, Mapping):
            continue
        rank = record.get("rank")
        if single_node and "host" in record and record.get("host") != host:
            problems.append(f"rank {rank}'s journal names host {record.get('host')!r}, the "
                            f"environment {host!r}")
        peak = record.get("peak_memory_bytes")
        if (on_cuda and _is_int(peak) and memory and len(sizes) == len(memory)
                and peak > max(sizes)):
            problems.append(f"rank {rank}'s peak CUDA memory {peak} exceeds every listed "
                            f"device's memory ({max(sizes)})")
    return problems


def environment_check(env: Any, params: Mapping[str, Any] | None, name: str,
                      journals: Sequence[Mapping[str, Any]] = ()) -> Check:
    """The one check ``<name>.environment``: the record agrees with params and journals."""
    problems = environment_problems(env, params, journals)
    check = f"{name}.environment"
    if not problems:
        return Check.passed(check, recomputed="devices, torch build, packages.torch, params "
                                              "device, world, journal hosts agree")
    more = f" (and {len(problems) - _SHOWN} more)" if len(problems) > _SHOWN else ""
    return Check.failed(check, f"{len(problems)} problem(s): " + "; ".join(problems[:_SHOWN])
                        + more)


def _same_build(distribution: Any, version: str) -> bool:
    """A distribution version and ``torch.__version__`` name one build: equal, or equal once
    the local tag (``+cu130``) that only one of them carries is set aside."""
    if not isinstance(distribution, str):
        return False
    if distribution == version:
        return True
    one, other = distribution.partition("+"), version.partition("+")
    return one[0] == other[0] and not (one[2] and other[2])
