"""Recipe and pipeline files (docs/format.md §6) parsed into typed configs; params into dataclasses."""

from __future__ import annotations

import dataclasses
import stat
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nscas.errors import ConfigError, NscasError
from nscas.objects import canonical
from nscas.suggestions import did_you_mean

STEP_PREFIX = "step."


@dataclass(frozen=True, slots=True, kw_only=True)
class StepConfig:
    name: str
    recipe: str
    inputs: dict[str, str]
    params: dict[str, Any]
    outputs: dict[str, str]
    share: int | None = None
    """How many steps at once (this one counted) this step lets use a GPU it runs on (a
    pipeline step's ``share``); None: as ``--gpu-share`` says. Where it runs, not what it
    computes: not part of the action."""

    @property
    def upstream(self) -> frozenset[str]:
        """The names of the steps whose outputs or receipts this step reads."""
        return frozenset(ref[0] for v in self.inputs.values()
                         if (ref := step_reference(v)) is not None)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFile:
    """A parsed recipe file (one step) or pipeline file (several).

    ``name`` is the pipeline's name (its ``name``, else its ``refs``, else the file's stem;
    None for a recipe file); ``refs`` the ref prefix its steps' outputs get, if it declares one;
    ``step_named`` whether a recipe file names its step (``name``). The runner records the
    pipeline and step names in each receipt (docs/format.md §3.9)."""

    path: Path
    steps: tuple[StepConfig, ...]
    pipeline: bool
    name: str | None = None
    refs: str | None = None
    step_named: bool = False
    sweep: tuple[tuple[tuple[str, ...], tuple[Any, ...]], ...] = ()
    """The ``[sweep]`` table: (step name and param key path, the values), expanded by
    nscas.runs.sweeps."""
    jobs: int | None = None
    """How many steps may run at once (``jobs`` of a pipeline file); None: one at a time, in
    this process, unless ``--jobs`` says otherwise (nscas.runs.scheduler)."""
    executor: ExecutorConfig | None = None
    """The ``[executor]`` table: where the steps run (``--executor`` overrides it)."""

    def receipt_names(self) -> tuple[str | None, bool]:
        """(the pipeline name to record, whether to record the step name)."""
        return self.name, self.pipeline or self.step_named


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorConfig:
    """A pipeline file's ``[executor]`` table."""

    kind: str = "local"
    """``local`` (processes on this machine) or ``ray`` (tasks on a Ray cluster)."""
    address: str | None = None
    """With ``ray``: the cluster's address (default: ``RAY_ADDRESS``, else a cluster started
    on this host)."""


EXECUTORS = ("local", "ray")


@dataclass(frozen=True, slots=True, kw_only=True)
class Override:
    """One ``--set STEP.PARAM=VALUE``: ``step`` None where a recipe file's param was named
    without its step; ``path`` the param's dotted key path; ``value`` parsed as TOML."""

    text: str
    step: str | None
    path: tuple[str, ...]
    value: Any


_STEP_KEYS = {"name", "recipe", "inputs", "params", "outputs", "share"}
SHARE_MAX = 64
_PIPELINE_KEYS = {"step", "name", "refs", "jobs", "sweep", "executor"}
JOBS_MAX = 1024


# A recipe or pipeline file is a few kilobytes; anything near this is not one.
RUN_FILE_MAX_BYTES = 1 << 20
RUN_FILE_MAX_DEPTH = 32


def load_run_file(path: Path) -> RunFile:
    try:
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(str(path), "a directory, not a recipe or pipeline file")
        if not stat.S_ISREG(mode):  # a FIFO or device would block or never end
            raise ConfigError(str(path), "not a regular file")
        with path.open("rb") as f:
            data = f.read(RUN_FILE_MAX_BYTES + 1)
        if len(data) > RUN_FILE_MAX_BYTES:
            raise ConfigError(str(path), f"larger than {RUN_FILE_MAX_BYTES} bytes: not a run file")
        raw = tomllib.loads(data.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(path), "no such file") from None
    except OSError as exc:
        raise ConfigError(str(path), exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"malformed TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nested array or table
        raise ConfigError(str(path), "nested too deeply to be a run file") from None
    # The file's own table is the first level; records nest at most 64 (docs/format.md §2.3).
    if canonical.value_depth(raw) - 1 > RUN_FILE_MAX_DEPTH:
        raise ConfigError(str(path), f"nested more than {RUN_FILE_MAX_DEPTH} deep")
    where = str(path)
    if "step" in raw:
        extra = sorted(set(raw) - _PIPELINE_KEYS)
        if extra:
            raise ConfigError(where, f"unknown top-level key(s) in a pipeline file: {', '.join(extra)}")
        for key in ("name", "refs"):
            if key in raw and (not isinstance(raw[key], str) or not raw[key]):
                raise ConfigError(where, f"'{key}' of a pipeline file must be a non-empty string")
        jobs = raw.get("jobs")
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int)
                                 or not 1 <= jobs <= JOBS_MAX):
            raise ConfigError(where, f"'jobs' of a pipeline file must be an integer from 1 to "
                                     f"{JOBS_MAX}, got {jobs!r}")
        if not isinstance(raw["step"], list) or not raw["step"]:
            raise ConfigError(where, "'step' must be one or more [[step]] tables")
        steps = tuple(_step(s, where, i) for i, s in enumerate(raw["step"]))
        names = [s.name for s in steps]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(where, f"step name(s) used twice: {', '.join(dupes)}")
        return RunFile(path=path, steps=_ordered(steps, where), pipeline=True,
                       name=raw.get("name") or raw.get("refs") or path.stem, refs=raw.get("refs"),
                       jobs=jobs, sweep=_sweep_table(raw.get("sweep", {}), where),
                       executor=_executor_table(raw.get("executor"), where))
    step = _step({"name": raw.get("recipe", "step"), **raw}, where, None)
    return RunFile(path=path, steps=(step,), pipeline=False, step_named="name" in raw)


def _executor_table(raw: Any, where: str) -> ExecutorConfig | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(where, "'executor' must be a table ([executor])")
    extra = sorted(set(raw) - {"kind", "address"})
    if extra:
        raise ConfigError(where, f"unknown key(s) in [executor]: {', '.join(extra)}")
    kind = raw.get("kind", "local")
    if kind not in EXECUTORS:
        raise ConfigError(where, f"[executor] kind must be one of {', '.join(EXECUTORS)}, "
                                 f"got {kind!r}")
    address = raw.get("address")
    if address is not None and (not isinstance(address, str) or not address):
        raise ConfigError(where, "[executor] address must be a non-empty string")
    return ExecutorConfig(kind=kind, address=address)


def _sweep_table(raw: Any, where: str) -> tuple[tuple[tuple[str, ...], tuple[Any, ...]], ...]:
    """``[sweep]``: ``"STEP.PARAM" = [values]`` (or nested tables, ``train.lr = [...]``)."""
    if not isinstance(raw, dict):
        raise ConfigError(where, "'sweep' must be a table of STEP.PARAM = [values]")
    out = []
    stack: list[tuple[tuple[str, ...], Any]] = [((), raw)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            for key, inner in value.items():
                stack.append(((*path, *key.split(".")), inner))
            continue
        if len(path) < 2 or not all(path):
            raise ConfigError(where, f"sweep.{'.'.join(path)} must name STEP.PARAM")
        if not isinstance(value, list) or not value:
            raise ConfigError(where, f"sweep.{'.'.join(path)} must be a non-empty array of "
                                     f"values, got {value!r}")
        out.append((path, tuple(value)))
    return tuple(sorted(out, key=lambda item: item[0]))


def parse_override(text: str) -> Override:
    """``STEP.PARAM=VALUE`` (or ``PARAM=VALUE``): VALUE read as a TOML value, else as a bare
    string (``device=cuda``). Which part names the step is settled against the file
    (``apply_overrides``)."""
    key, sep, value = text.partition("=")
    path = tuple(key.strip().split("."))
    if not sep or not all(path):
        raise ConfigError("--set", f"{text!r} is not STEP.PARAM=VALUE")
    try:
        parsed = tomllib.loads(f"value = {value}")["value"]
    except (tomllib.TOMLDecodeError, RecursionError):
        parsed = value
    return Override(text=text, step=None, path=path, value=parsed)


def apply_overrides(spec: RunFile, overrides: tuple[Override, ...]) -> RunFile:
    """The run file with each ``--set`` written into its step's params table, as if the file
    said it. In a pipeline the first part names the step; in a recipe file it may (its name),
    or the whole key is the param. An unknown step is an error naming it; unknown params are
    found where the params are parsed, like the file's."""
    params = {s.name: _copy_table(s.params) for s in spec.steps}
    for item in overrides:
        step, path = override_target(spec, item)
        table = params[step]
        for depth, part in enumerate(path[:-1]):
            inner = table.setdefault(part, {})
            if not isinstance(inner, dict):
                raise ConfigError("--set", f"{item.text!r}: params.{'.'.join(path[:depth + 1])} "
                                           f"of step {step!r} is not a table")
            table = inner
        table[path[-1]] = item.value
    steps = tuple(dataclasses.replace(s, params=params[s.name]) for s in spec.steps)
    return dataclasses.replace(spec, steps=steps)


def override_target(spec: RunFile, item: Override) -> tuple[str, tuple[str, ...]]:
    """(the step an override sets a param of, the param's key path in its params table)."""
    head, rest = item.path[0], item.path[1:]
    if not spec.pipeline:
        step = spec.steps[0].name
        return step, rest if rest and head == step else item.path
    names = [s.name for s in spec.steps]
    if head not in names:
        raise ConfigError("--set", f"{item.text!r} names step {head!r}, but the file has "
                                   f"no such step{did_you_mean(head, names)} "
                                   f"(steps: {', '.join(names)})")
    if not rest:
        raise ConfigError("--set", f"{item.text!r} names no param of step {head!r} "
                                   "(STEP.PARAM=VALUE)")
    return head, rest


def _copy_table(table: dict[str, Any]) -> dict[str, Any]:
    return {k: _copy_table(v) if isinstance(v, dict) else v for k, v in table.items()}


def _step(raw: Any, where: str, index: int | None) -> StepConfig:
    label = f"[[step]] #{index + 1}" if index is not None else "the recipe file"
    if not isinstance(raw, dict):
        raise ConfigError(where, f"{label} must be a table")
    # A recipe file's one step runs in this process, alone: it shares nothing.
    extra = sorted(set(raw) - (_STEP_KEYS if index is not None else _STEP_KEYS - {"share"}))
    if extra:
        raise ConfigError(where, f"unknown key(s) in {label}: {', '.join(extra)}")
    share = raw.get("share")
    if share is not None and (isinstance(share, bool) or not isinstance(share, int)
                              or not 1 <= share <= SHARE_MAX):
        raise ConfigError(where, f"'share' of {label} must be an integer from 1 to {SHARE_MAX} "
                                 f"(the steps that may use one GPU at once), got {share!r}")
    for key in ("name", "recipe"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(where, f"{label} needs '{key}' as a non-empty string")
    tables = {}
    for key in ("inputs", "params", "outputs"):
        value = raw.get(key, {})
        if not isinstance(value, dict):
            raise ConfigError(where, f"'{key}' of {label} must be a table")
        tables[key] = value
    for key in ("inputs", "outputs"):
        for name, value in tables[key].items():
            if not isinstance(value, str) or not value:
                raise ConfigError(where, f"{key}.{name} of {label} must be an ID or ref name string")
    return StepConfig(name=raw["name"], recipe=raw["recipe"], inputs=tables["inputs"],
                      params=tables["params"], outputs=tables["outputs"], share=share)


def step_reference(value: str) -> tuple[str, str] | None:
    """(step name, output) for ``step.<name>.<output>``; None for IDs and ref names."""
    if not value.startswith(STEP_PREFIX):
        return None
    rest = value[len(STEP_PREFIX):]
    name, sep, output = rest.rpartition(".")
    if not sep or not name or not output:
        return None
    return name, output


def downstream(steps: tuple[StepConfig, ...], name: str) -> set[str]:
    """The steps that depend on step ``name``, directly or through others."""
    found: set[str] = set()
    frontier = {name}
    while frontier:
        frontier = {s.name for s in steps if s.name not in found and s.upstream & frontier}
        found |= frontier
    return found - {name}


def _ordered(steps: tuple[StepConfig, ...], where: str) -> tuple[StepConfig, ...]:
    """Steps in dependency order (stable: file order where free)."""
    by_name = {s.name: s for s in steps}
    deps: dict[str, set[str]] = {}
    for s in steps:
        deps[s.name] = set()
        for key, value in s.inputs.items():
            ref = step_reference(value)
            if ref is None:
                continue
            if ref[0] not in by_name:
                raise ConfigError(where, f"step {s.name!r}: inputs.{key} names unknown step "
                                         f"{ref[0]!r}")
            deps[s.name].add(ref[0])
    order: list[StepConfig] = []
    done: set[str] = set()
    while len(order) < len(steps):
        ready = [s for s in steps if s.name not in done and deps[s.name] <= done]
        if not ready:
            cycle = _cycle({n: deps[n] - done for n in by_name if n not in done})
            raise ConfigError(where, f"steps depend on each other in a cycle: {' -> '.join(cycle)}")
        order.append(ready[0])
        done.add(ready[0].name)
    return tuple(order)


def _cycle(deps: dict[str, set[str]]) -> list[str]:
    """One dependency cycle, closed (``a -> b -> a``); every node here has an unmet dependency."""
    path = [min(deps)]
    while True:
        nxt = min(deps[path[-1]])
        if nxt in path:
            return [*path[path.index(nxt):], nxt]
        path.append(nxt)


def parse_params(cls: type, raw: dict[str, Any], where: str, prefix: str = "params") -> Any:
    """Build the frozen params dataclass ``cls`` from a TOML table, strictly."""
    if not isinstance(raw, dict):
        raise ConfigError(where, f"{prefix} must be a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(where, f"unknown key(s) in {prefix}: {', '.join(unknown)} "
                                 f"(known: {', '.join(sorted(fields)) or 'none'})")
    hints = typing.get_type_hints(cls)
    values = {name: _coerce(hints[name], value, where, f"{prefix}.{name}") for name, value in raw.items()}
    try:
        obj = cls(**values)
    except TypeError as exc:
        raise ConfigError(where, f"{prefix}: {exc}") from None
    except NscasError as exc:  # a params class that validates itself on construction
        raise ConfigError(where, f"{prefix}: {exc.message}") from None
    check = getattr(obj, "validate", None)
    if callable(check):
        problem = check()
        if problem:
            raise ConfigError(where, f"{prefix}: {problem}")
    return obj


def _coerce(tp: Any, value: Any, where: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where, key)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0] if errors else ConfigError(where, f"{key}: bad value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(where, f"{key} must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return parse_params(tp, value, where, key)
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(where, f"{key} must be an array, got {type(value).__name__}")
        inner = args[0] if args else Any
        items = [_coerce(inner, v, where, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(where, f"{key} must be a table")
        return {k: _coerce(args[1], v, where, f"{key}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(where, f"{key} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, f"{key} must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(where, f"{key} must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(where, f"{key} must be a string, got {value!r}")
        return value
    raise ConfigError(where, f"{key}: unsupported parameter type {tp!r}")


def param_takes_array(cls: type, path: tuple[str, ...]) -> bool:
    """Whether the param at ``path`` of the params dataclass ``cls`` is declared as an array
    (a list or tuple, or a union holding one); False for a param it does not have."""
    tp: Any = cls
    for part in path:
        if not dataclasses.is_dataclass(tp):
            return False
        hints = typing.get_type_hints(tp)
        if part not in hints:
            return False
        tp = hints[part]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = args[0] if len(args) == 1 else args
    options = tp if isinstance(tp, list) else [tp]
    return any(_is_array_type(o) for o in options)


def _is_array_type(tp: Any) -> bool:
    # get_origin's first overload (ParamSpecArgs -> ParamSpec) is what mypy picks for Any.
    origin: object = typing.get_origin(tp)
    return origin in (list, tuple) or tp in (list, tuple) or tp is Any


def params_to_json(obj: Any) -> Any:
    """Params as plain JSON values (tuples become arrays) for the action record."""
    if dataclasses.is_dataclass(obj):
        return {f.name: params_to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list | tuple):
        return [params_to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {k: params_to_json(v) for k, v in obj.items()}
    return obj
