"""The safetensors dtypes nscas accepts: the one table that record checks (nscas.objects.kinds), the
tensor walk of params/1 (nscas.models.checkpoints) and checkpoint comparison (nscas.runs.verdicts) derive
what they need from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True, kw_only=True)
class DType:
    bits: int
    """Bits per element (a tensor of n elements fills n * bits / 8 bytes)."""
    numpy: str | None
    """The little-endian NumPy type string its elements read as, or None where NumPy has none
    (BF16 and the 8-, 6- and 4-bit floats are read by hand or not at all)."""


DTYPES: Mapping[str, DType] = MappingProxyType({
    "BOOL": DType(bits=8, numpy="|b1"), "U8": DType(bits=8, numpy="|u1"),
    "I8": DType(bits=8, numpy="|i1"), "I16": DType(bits=16, numpy="<i2"),
    "U16": DType(bits=16, numpy="<u2"), "F16": DType(bits=16, numpy="<f2"),
    "BF16": DType(bits=16, numpy=None), "I32": DType(bits=32, numpy="<i4"),
    "U32": DType(bits=32, numpy="<u4"), "F32": DType(bits=32, numpy="<f4"),
    "F64": DType(bits=64, numpy="<f8"), "I64": DType(bits=64, numpy="<i8"),
    "U64": DType(bits=64, numpy="<u8"), "F8_E4M3": DType(bits=8, numpy=None),
    "F8_E5M2": DType(bits=8, numpy=None), "F8_E8M0": DType(bits=8, numpy=None),
    "F4": DType(bits=4, numpy=None), "F6_E2M3": DType(bits=6, numpy=None),
    "F6_E3M2": DType(bits=6, numpy=None), "C64": DType(bits=64, numpy=None),
})
"""Every safetensors dtype name nscas accepts, with its element size and NumPy reading."""
