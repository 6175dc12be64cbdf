"""``sha256_stream``: the SHA-256 parameter digest of docs/format.md §4, for comparison with published ones.

The content-addressed parameter digest (``params/1``) is the store's business; this one is a
streaming hash over a live model, cheap enough to exchange between ranks at every checkpoint.
"""

from __future__ import annotations

import hashlib
import sys

import torch


def sha256_stream(model: torch.nn.Module) -> str:
    """SHA-256 hex over, per parameter in registration order: name, 0, str(shape), 0, raw bytes.

    Raw bytes are C-contiguous and little-endian in the stored dtype. Tied parameters appear
    once, under their first name, as ``named_parameters()`` yields them.
    """
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        digest.update(name.encode("utf-8"))
        digest.update(b"\0")
        digest.update(str(tuple(param.shape)).encode("utf-8"))
        digest.update(b"\0")
        digest.update(tensor_bytes(param))
    return digest.hexdigest()


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of ``tensor`` in its own dtype, C order (one tensor at a time,
    so a model on a GPU is copied to the host piecewise). A view, not a copy: hashers read it
    directly, which halves the time of a digest of a large model."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8)
    if sys.byteorder == "big" and flat.element_size() > 1:
        raw = raw.reshape(-1, flat.element_size()).flip(1).reshape(-1)
    return raw.numpy().data
