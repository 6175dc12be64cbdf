"""GGUF conversions, rechecked: the header of a GGUF file read here with the standard library,
and the checks of a ``convert-gguf`` run (docs/format.md §3.3, §6.9).

A GGUF file (llama.cpp's format, version 2 or 3) starts with ``GGUF``, its version, its tensor
count and its metadata count; then the metadata (key, type, value) and one entry per tensor
(name, dimensions, type, offset). Nothing after the header is needed to count what the file
holds, so no tensor is dequantised here: that would be a model run.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..core.errors import VerifierError
from ..core.results import Check
from ..core.runs import Run
from ..records.closure import Objects, Unusable
from ..tasks.chat import TemplateError, end_of_turn

MAGIC = b"GGUF"
NOT_PARAMETERS = frozenset({"rope_freqs.weight"})
"""Tensors that are precomputed buffers, not parameters (as the recipe counts them)."""
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_COUNT = 1 << 24
"""More tensors, metadata entries or dimensions than any real file has: a corrupt header."""
_MAX_DEPTH = 4


class GgufError(VerifierError):
    """Bytes that are not a readable GGUF header."""

    def __init__(self, why: str) -> None:
        super().__init__(f"not a readable GGUF file: {why}")
        self.why = why


@dataclass(frozen=True, slots=True, kw_only=True)
class GgufHeader:
    version: int
    architecture: str | None
    """``general.architecture``, if the metadata has it as a string."""
    shapes: dict[str, tuple[int, ...]]
    """Every tensor's dimensions, by name."""

    def counts(self) -> tuple[int, int]:
        """(tensors, elements) over the tensors that are parameters."""
        kept = [s for name, s in self.shapes.items() if name not in NOT_PARAMETERS]
        return len(kept), sum(math.prod(s) for s in kept)


class _Reader:
    def __init__(self, stream: BinaryIO, size: int) -> None:
        self.stream, self.size = stream, size

    def take(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise GgufError("it ends inside its header")
        return data

    def skip(self, n: int) -> None:
        if n < 0 or self.stream.tell() + n > self.size:
            raise GgufError("a metadata value runs past the end of the file")
        self.stream.seek(n, 1)

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def count(self, what: str) -> int:
        n: int = self.scalar("<Q")
        if n > _MAX_COUNT:
            raise GgufError(f"{what} count {n} is impossible")
        return n

    def string(self) -> bytes:
        n = self.scalar("<Q")
        if n > self.size:
            raise GgufError(f"a string of {n} bytes is longer than the file")
        return self.take(n)

    def value(self, kind: int, depth: int = 0) -> Any:
        """A metadata value; arrays are skipped (None), since no check needs one."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY and depth < _MAX_DEPTH:
            inner, n = self.scalar("<I"), self.count("array")
            if inner in _SCALARS:
                self.skip(n * struct.calcsize(_SCALARS[inner]))
            else:
                for _ in range(n):
                    self.value(inner, depth + 1)
            return None
        raise GgufError(f"unknown metadata type {kind}")


def read_header(stream: BinaryIO, size: int) -> GgufHeader:
    """The header of a GGUF file of ``size`` bytes; raises ``GgufError``."""
    r = _Reader(stream, size)
    if r.take(4) != MAGIC:
        raise GgufError("it does not start with 'GGUF'")
    version = r.scalar("<I")
    if version not in (2, 3):
        raise GgufError(f"version {version} is not 2 or 3")
    tensors, entries = r.count("tensor"), r.count("metadata")
    architecture = None
    for _ in range(entries):
        key = r.string()
        value = r.value(r.scalar("<I"))
        if key == b"general.architecture" and isinstance(value, bytes):
            architecture = value.decode("utf-8", "replace")
    shapes: dict[str, tuple[int, ...]] = {}
    for _ in range(tensors):
        name = r.string().decode("utf-8", "replace")
        dims = r.scalar("<I")
        if dims > 8:
            raise GgufError(f"tensor {name!r} has {dims} dimensions")
        shape = tuple(r.scalar("<Q") for _ in range(dims))
        r.scalar("<I"), r.scalar("<Q")  # its type and offset: not needed to count
        if name in shapes:
            raise GgufError(f"tensor {name!r} appears twice")
        shapes[name] = shape
    return GgufHeader(version=version, architecture=architecture, shapes=shapes)


def convert_checks(objects: Objects, run: Run, values: dict[str, Any],
                   tokenizer: Callable[[str], Any]) -> list[Check]:
    """The checks of a ``convert-gguf`` run; recomputed claim values go into ``values``.

    ``<run>.checkpoint``: the output is a step-0 checkpoint without parent whose ``gguf``
    member links the run's input and whose ``source`` is ``gguf``; ``<run>.gguf.parameters``:
    the checkpoint holds as many parameters as the file's tensors have elements, all F32
    (the ``dtype`` param); and the file's SHA-256, tensor and element counts, and the
    checkpoint's end-of-turn token (``tokenizer`` loads a checkpoint's tokenizer)."""
    name = run.name
    source = run.inputs["gguf"]
    record = objects.record_of(run.outputs["checkpoint"], "checkpoint/1")
    problems = []
    if record.get("gguf") != source:
        problems.append(f"its gguf member {record.get('gguf')!r} is not the run's input")
    if record.get("source") != "gguf":
        problems.append(f"its source {record.get('source')!r} is not 'gguf'")
    if record["step"] != 0 or record["parent"] is not None:
        problems.append("a conversion is step 0 with no parent")
    checks = [Check.verdict(f"{name}.checkpoint", not problems, recomputed=source,
                            message="; ".join(problems))]
    state = objects.state(source)
    if state.problem is not None:
        raise Unusable(source, state.problem)
    values["gguf_sha256"] = state.sha256
    with objects.as_file(source, "model.gguf") as path, path.open("rb") as stream:
        header = read_header(stream, state.size)
    tensors, elements = header.counts()
    values["gguf_tensors"], values["gguf_parameters"] = tensors, elements
    params = objects.record_of(record["params"], "params/1")["tensors"]
    held = sum(math.prod(t["shape"]) for t in params.values())
    dtypes = sorted({t["dtype"] for t in params.values()})
    wanted = {"float32": "F32"}.get(run.params.get("dtype", "float32"))
    problems = []
    if held != elements:
        problems.append(f"the checkpoint holds {held} parameters, the GGUF file's tensors "
                        f"{elements} elements")
    if dtypes != [wanted]:
        problems.append(f"the checkpoint's dtypes {dtypes} are not the dtype param's {wanted}")
    checks.append(Check.verdict(f"{name}.gguf.parameters", not problems, claimed=held,
                                recomputed=elements, message="; ".join(problems)))
    checks.append(Check.skipped(
        f"{name}.gguf.weights", "the dequantised values are not recomputed here (that is a "
        "conversion run: nscas import-gguf --rerun reconverts the file and compares); their "
        "count, shapes' total and dtype are", needs="model"))
    turn = checkpoint_end_of_turn(objects, run.outputs["checkpoint"], tokenizer)
    if isinstance(turn, str):
        checks.append(Check.failed(f"{name}.template", turn))
    else:
        values["end_of_turn"] = turn
    return checks


def checkpoint_end_of_turn(objects: Objects, checkpoint: str,
                           tokenizer: Callable[[str], Any]) -> dict[str, Any] | str:
    """``{"token", "id"}`` a checkpoint's own template and tokenizer give, or why none."""
    files = objects.record_of(objects.record_of(checkpoint, "checkpoint/1")["files"], "tree/1")
    loaded = tokenizer(checkpoint)
    if loaded is None:
        return "the checkpoint has no readable tokenizer.json to derive its end of turn with"
    try:
        return end_of_turn(objects, files["entries"], loaded)
    except TemplateError as exc:
        return exc.message
