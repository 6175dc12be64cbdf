"""Sweeps: one step run once per value of a param, its downstream steps once per arm with it.

``--set train.lr=[1e-5,3e-5]`` (an array set on a param that is not itself an array) or a
``[sweep]`` table (``"train.lr" = [1e-5, 3e-5]``) expands the file: the swept step becomes one
step per value, named with the variant naming of its settings (``train.lr-1e-5``), and every
step downstream of it one per arm (``evaluate.train.lr-1e-5``), reading that arm's outputs.
Several swept params give the product of their values, each step expanded over the params
upstream of it (or its own). Each arm's steps have their own names, so their own refs
(``<refs>/<arm step>/...``) and previous runs; a ref a step declares gets
``/variants/<arm>`` (docs/format.md §6.13).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from typing import Any

from nscas.errors import ConfigError
from nscas.runs.config import (
    STEP_PREFIX,
    Override,
    RunFile,
    StepConfig,
    downstream,
    override_target,
    step_reference,
)
from nscas.runs.variants import variant_name, variant_prefix

Key = tuple[str, ...]
"""A swept param: the step's name, then the param's key path."""
Sweeps = Mapping[Key, tuple[Any, ...]]
SWEEP_MAX_ARMS = 1024


def split_sweeps(spec: RunFile, overrides: tuple[Override, ...],
                 takes_array: Callable[[str, tuple[str, ...]], bool],
                 ) -> tuple[tuple[Override, ...], dict[Key, tuple[Any, ...]]]:
    """(the overrides that set one value, the sweeps the others give): an array set on a
    param that does not itself take an array sweeps it. ``takes_array(step, path)`` says
    whether the step's param at ``path`` is declared as an array."""
    plain: list[Override] = []
    sweeps: dict[Key, tuple[Any, ...]] = dict(spec.sweep)
    for item in overrides:
        step, path = override_target(spec, item)
        if isinstance(item.value, list) and not takes_array(step, path):
            if not item.value:
                raise ConfigError("--set", f"{item.text!r} sweeps no values")
            sweeps[(step, *path)] = tuple(item.value)
        else:
            plain.append(item)
    return tuple(plain), sweeps


def expand(spec: RunFile, sweeps: Sweeps) -> RunFile:
    """The file with each swept step, and each step downstream of one, one step per arm."""
    if not sweeps:
        return spec
    names = {s.name for s in spec.steps}
    for key in sweeps:
        if key[0] not in names:
            raise ConfigError(str(spec.path), f"sweep {'.'.join(key)!r} names step {key[0]!r}, "
                                              "but the file has no such step")
    affecting = {s.name: sorted(k for k in sweeps
                                if k[0] == s.name or s.name in downstream(spec.steps, k[0]))
                 for s in spec.steps}
    arms = 1
    for key in sweeps:
        arms *= len(sweeps[key])
    if arms > SWEEP_MAX_ARMS:
        raise ConfigError(str(spec.path), f"the sweep has {arms} arms; at most {SWEEP_MAX_ARMS}")
    steps: list[StepConfig] = []
    for step in spec.steps:
        keys = affecting[step.name]
        if not keys:
            steps.append(step)
            continue
        for values in itertools.product(*(sweeps[k] for k in keys)):
            arm = dict(zip(keys, values, strict=True))
            steps.append(_arm_step(step, arm, affecting))
    taken = [s.name for s in steps]
    clash = sorted({n for n in taken if taken.count(n) > 1})
    if clash:
        raise ConfigError(str(spec.path), f"the sweep names step(s) {', '.join(clash)} twice "
                                          "(an arm's name is a step's name already)")
    return dataclasses.replace(spec, steps=tuple(steps), sweep=())


def arm_name(step: str, arm: Mapping[Key, Any]) -> str:
    """The name of ``step`` in an arm: ``train.lr-1e-5`` where the arm sets ``step``'s own
    params only, else ``evaluate.train.lr-1e-5``."""
    if all(key[0] == step for key in arm):
        return f"{step}.{variant_name({key[1:]: value for key, value in arm.items()})}"
    return f"{step}.{variant_name(arm)}"


def _arm_step(step: StepConfig, arm: Mapping[Key, Any],
              affecting: Mapping[str, list[Key]]) -> StepConfig:
    params = _with(step.params, {key[1:]: v for key, v in arm.items() if key[0] == step.name})
    inputs = {}
    for name, value in step.inputs.items():
        ref = step_reference(value)
        if ref is not None and affecting[ref[0]]:
            upstream = {k: arm[k] for k in affecting[ref[0]]}
            value = f"{STEP_PREFIX}{arm_name(ref[0], upstream)}.{ref[1]}"
        inputs[name] = value
    label = variant_name(arm)
    outputs = {name: variant_prefix(ref_name, label) for name, ref_name in step.outputs.items()}
    return dataclasses.replace(step, name=arm_name(step.name, arm), params=params,
                               inputs=inputs, outputs=outputs)


def _with(table: dict[str, Any], settings: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
    out = _copy(table)
    for path, value in settings.items():
        inner = out
        for part in path[:-1]:
            inner = inner.setdefault(part, {})
            if not isinstance(inner, dict):
                raise ConfigError("sweep", f"params.{'.'.join(path[:-1])} is not a table")
        inner[path[-1]] = value
    return out


def _copy(table: dict[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in table.items()}
