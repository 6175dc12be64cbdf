"""What ranks exchange besides gradients: parameter digests, RNG states, small integers.

These go over a CPU (gloo) group with a patient timeout, because they follow slow local work
(loading a model, writing a checkpoint) that one rank may finish well after another.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from typing import Any

import blake3
import torch
import torch.distributed as dist

from nscas.errors import RecipeError
from nscas.recipes.common.digests import tensor_bytes

DIGEST_BYTES = 32


class ParameterMismatch(RecipeError):
    """Ranks hold different parameters; names every rank's digest and the first differing
    tensor."""

    def __init__(self, where: str, digests: list[str], tensor: str | None) -> None:
        shown = ", ".join(f"rank {r} has {d}" for r, d in enumerate(digests))
        first = f"; first differing tensor: {tensor}" if tensor else ""
        super().__init__(f"ranks disagree on the parameters {where}: {shown}{first}")
        self.where = where
        self.digests = digests
        self.tensor = tensor


STAGING_BYTES = 256 << 20
"""Most bytes of one pinned host buffer through which a GPU model's parameters are hashed."""


class HostStaging:
    """A host buffer, reused from one digest to the next, that a GPU model's parameters are
    copied into (pinned: direct DMA, no page faults, no driver bounce copy) a buffer-full at a
    time: every copy enqueued without blocking, then one synchronisation, then the bytes hashed.

    A copy of each tensor into fresh pageable memory, one at a time, costs a host allocation,
    its page faults and the driver's own staging copy for every parameter of every digest.
    """

    def __init__(self, size: int, *, pin: bool) -> None:
        self.buffer = torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=pin)

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> HostStaging | None:
        """A pinned buffer for ``model`` if its parameters live on a GPU; None otherwise (a CPU
        model's parameters are hashed where they are)."""
        params = list(model.parameters())
        if not params or params[0].device.type != "cuda":
            return None
        total = sum(p.numel() * p.element_size() for p in params)
        return cls(min(total, STAGING_BYTES), pin=True)

    def hash_into(self, hasher: Any, tensors: Sequence[torch.Tensor]) -> None:
        """``hasher.update`` with the raw bytes of ``tensors``, in order (little-endian hosts)."""
        room, filled = self.buffer.numel(), 0
        stream = None
        for tensor in tensors:
            raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            done = 0
            while done < raw.numel():
                if filled == room:
                    self._drain(hasher, filled, stream)
                    filled = 0
                n = min(raw.numel() - done, room - filled)
                self.buffer[filled:filled + n].copy_(raw[done:done + n], non_blocking=True)
                if raw.is_cuda:
                    stream = torch.cuda.current_stream(raw.device)
                filled, done = filled + n, done + n
        if filled:
            self._drain(hasher, filled, stream)

    def _drain(self, hasher: Any, filled: int, stream: Any) -> None:
        if stream is not None:
            stream.synchronize()  # the enqueued copies have landed
        hasher.update(self.buffer[:filled].numpy().data)


def _hasher() -> Any:
    """A BLAKE3 hasher that hashes a large buffer on up to torch's intra-op thread count (the
    digest is the same for any count)."""
    return blake3.blake3(max_threads=max(1, torch.get_num_threads()))


def parameter_digest(model: torch.nn.Module, staging: HostStaging | None = None) -> bytes:
    """BLAKE3 of the raw bytes of every parameter, in registration order (tied ones once).

    Parameters on the CPU are hashed in place; parameters on a GPU go through ``staging`` (a
    buffer made for this call when none is given; keep one to reuse it)."""
    params = [param for _name, param in model.named_parameters()]
    hasher = _hasher()
    if params and params[0].device.type == "cuda" and sys.byteorder == "little":
        (staging or HostStaging.for_model(model) or HostStaging(0, pin=False)).hash_into(
            hasher, params)
        return hasher.digest()
    for param in params:
        hasher.update(tensor_bytes(param))
    return hasher.digest()


def tensor_digests(model: torch.nn.Module) -> tuple[list[str], bytes]:
    """Parameter names and the concatenation of their 32-byte BLAKE3 digests."""
    names, digests = [], []
    for name, param in model.named_parameters():
        names.append(name)
        digests.append(blake3.blake3(tensor_bytes(param)).digest())
    return names, b"".join(digests)


def all_gather_bytes(payload: bytes, *, group: Any) -> list[bytes]:
    """Every rank's ``payload`` (all the same length), in rank order."""
    world = dist.get_world_size(group)
    local = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local, group=group)
    return [bytes(t.numpy().tobytes()) for t in gathered]


def agree_on_parameters(model: torch.nn.Module, *, group: Any, where: str) -> str:
    """Check that every rank holds the same parameters; returns the BLAKE3 hex they agree on.

    On disagreement all ranks exchange per-tensor digests to name the first differing tensor,
    then raise :class:`ParameterMismatch`.
    """
    digests = all_gather_bytes(parameter_digest(model), group=group)
    if len(set(digests)) == 1:
        return digests[0].hex()
    names, mine = tensor_digests(model)
    everyone = all_gather_bytes(mine, group=group)
    raise ParameterMismatch(where, [d.hex() for d in digests], first_difference(names, everyone))


def first_difference(names: list[str], per_rank: list[bytes]) -> str | None:
    """The first tensor whose 32-byte digest is not the same on every rank."""
    for i, name in enumerate(names):
        span = slice(i * DIGEST_BYTES, (i + 1) * DIGEST_BYTES)
        if len({digests[span] for digests in per_rank}) > 1:
            return name
    return None


def broadcast_object(value: Any, *, group: Any) -> Any:
    """Rank 0's ``value`` (a small picklable object) on every rank."""
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's random number generator states."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def gather_objects(value: Any, *, group: Any) -> list[Any] | None:
    """Every rank's ``value`` (picklable, CPU tensors) on rank 0, in rank order; None elsewhere."""
    rank = dist.get_rank(group)
    gathered: list[Any] | None = [None] * dist.get_world_size(group) if rank == 0 else None
    dist.gather_object(value, gathered, dst=0, group=group)
    return gathered


def gather_rng_states(device: torch.device, *, group: Any) -> list[dict[str, Any]]:
    """Every rank's RNG states, in rank order (rank 0 saves them all in a checkpoint)."""
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, rng_state(device), group=group)
    return gathered
