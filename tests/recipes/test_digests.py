"""sha256_stream (docs/format.md §4) against a hashlib computation written out by hand."""

from __future__ import annotations

import hashlib
import struct

import torch
from torch import nn

from nscas.recipes.common.digests import sha256_stream, tensor_bytes


class TwoTensors(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        # registered "zeta" first: the digest follows registration order, not the alphabet
        self.zeta = nn.Parameter(torch.tensor([[1.0, -2.0, 0.5], [3.0, 0.25, -1.5]]))
        self.alpha = nn.Parameter(torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.bfloat16))


def hand_digest() -> str:
    h = hashlib.sha256()
    h.update(b"zeta\x00(2, 3)\x00")
    h.update(struct.pack("<6f", 1.0, -2.0, 0.5, 3.0, 0.25, -1.5))
    h.update(b"alpha\x00(4,)\x00")
    # bfloat16 is the upper half of the float32 bit pattern, little-endian
    h.update(b"".join(struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0] >> 16)[:2]
                      for v in (1.0, -2.0, 0.5, 3.0)))
    return h.hexdigest()


def test_matches_hand_built_hash() -> None:
    module = TwoTensors()
    assert sha256_stream(module) == hand_digest()
    assert tensor_bytes(module.alpha) == bytes.fromhex("803f00c0003f4040")


def test_non_contiguous_parameters_hash_in_c_order() -> None:
    module = TwoTensors()
    transposed = module.zeta.detach().t().contiguous().t()  # same values, Fortran layout
    assert not transposed.is_contiguous()
    module.zeta = nn.Parameter(transposed)
    assert sha256_stream(module) == hand_digest()


def test_any_change_changes_the_digest() -> None:
    base = sha256_stream(TwoTensors())
    changed = TwoTensors()
    with torch.no_grad():
        changed.alpha[3] = 2.0
    assert sha256_stream(changed) != base
    renamed = nn.Module()
    renamed.zeta2 = TwoTensors().zeta
    renamed.alpha = TwoTensors().alpha
    assert sha256_stream(renamed) != base


def test_tied_parameters_count_once_and_scalars_have_empty_shape() -> None:
    module = nn.Module()
    module.a = nn.Linear(2, 2, bias=False)
    module.b = nn.Linear(2, 2, bias=False)
    module.b.weight = module.a.weight
    module.s = nn.Parameter(torch.tensor(1.5))
    with torch.no_grad():
        module.a.weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    # named_parameters(): a module's own parameters before its children's
    assert [name for name, _ in module.named_parameters()] == ["s", "a.weight"]
    h = hashlib.sha256()
    h.update(b"s\x00()\x00" + struct.pack("<f", 1.5))
    h.update(b"a.weight\x00(2, 2)\x00" + struct.pack("<4f", 1.0, 2.0, 3.0, 4.0))
    assert sha256_stream(module) == h.hexdigest()
