"""DiLoCo's outer step (docs/experiment.md §3.13): θ_outer, its outer SGD, one all-reduce.

Every ``inner_steps`` inner updates each rank computes its pseudo-gradient
``Δ_r = θ_outer − θ_r`` into one flat FP32 buffer, the ranks sum the buffers with one
``all_reduce`` on the default process group and divide by W, the averaged Δ becomes the
gradient of θ_outer, ``torch.optim.SGD`` (Nesterov momentum, or plain at momentum 0) steps
θ_outer, and every rank copies θ_outer into its model. This is the algorithm of torchft's
``DiLoCo`` (its ``_StreamingDiLoCoFragment.prepare_sync``/``perform_sync``) without its
Manager: no quorum, no lighthouse, no healing, so a run stays one deterministic program.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nscas.errors import RecipeError
from nscas.recipes.train.config import TrainParams


@dataclass(frozen=True, slots=True, kw_only=True)
class OuterRecord:
    """What one outer step did, as this rank saw it (every value but ``rank`` is global)."""

    step: int
    """The inner step it follows (a multiple of ``inner_steps``)."""
    outer_step: int
    """1-based number of the outer step: ``step / inner_steps``."""
    pseudo_gradient_norm: float
    """L2 norm of the averaged pseudo-gradient (the same on every rank)."""
    bytes_sent: int
    """Payload bytes this rank contributes to the all-reduce: numel × element size of every
    trained parameter (0 for one rank, which reduces nothing)."""
    seconds: float
    """Wall time from the pseudo-gradient's first subtraction to the last copy into the model."""
    parameters: str
    """BLAKE3 hex of the parameters after the outer step, agreed by every rank."""

    def entry(self, *, rank: int) -> dict[str, Any]:
        return {"event": "outer", "rank": rank, "step": self.step,
                "outer_step": self.outer_step,
                "pseudo_gradient_norm": self.pseudo_gradient_norm,
                "bytes_sent": self.bytes_sent, "seconds": self.seconds,
                "parameters": self.parameters}


class OuterStep:
    """θ_outer (a copy of the trained parameters), the outer SGD over it, and the flat
    pseudo-gradient buffer the all-reduce sends."""

    def __init__(self, model: torch.nn.Module, params: TrainParams, *, world: int) -> None:
        self.world = world
        self.local = [p for p in model.parameters() if p.requires_grad]
        if not self.local:
            raise RecipeError("diloco needs trained parameters")
        self.outer = [p.detach().clone() for p in self.local]
        first = self.local[0]
        self.delta = torch.empty(sum(p.numel() for p in self.local), dtype=first.dtype,
                                 device=first.device)
        views, offset = [], 0
        for param, outer in zip(self.local, self.outer, strict=True):
            views.append(self.delta[offset: offset + param.numel()].view_as(param))
            offset += param.numel()
            outer.grad = views[-1]
        self.views = views
        momentum = params.outer_momentum
        self.optimizer = torch.optim.SGD(self.outer, lr=params.outer_lr, momentum=momentum,
                                         nesterov=momentum > 0)

    @property
    def bytes_sent(self) -> int:
        """numel × element size of the buffer this rank all-reduces (0 for one rank)."""
        return self.delta.numel() * self.delta.element_size() if self.world > 1 else 0

    def step(self) -> tuple[float, float]:
        """One outer step; returns (pseudo-gradient norm, seconds)."""
        device = self.delta.device
        _synchronise(device)
        started = time.perf_counter()
        with torch.no_grad():
            for outer, local, view in zip(self.outer, self.local, self.views, strict=True):
                torch.sub(outer, local, out=view)
            if self.world > 1:
                dist.all_reduce(self.delta)  # gloo has no AVG: a sum, then / W
                self.delta.div_(self.world)
            norm = torch.linalg.vector_norm(self.delta)
            self.optimizer.step()
            for outer, local in zip(self.outer, self.local, strict=True):
                local.copy_(outer)
        value = norm.item()
        _synchronise(device)
        return value, time.perf_counter() - started

    def state_dict(self) -> dict[str, Any]:
        """The outer SGD's state (momentum buffers, on the CPU) for a checkpoint."""
        state = self.optimizer.state_dict()
        return {"param_groups": state["param_groups"],
                "state": {k: {n: (v.detach().cpu() if isinstance(v, torch.Tensor) else v)
                              for n, v in s.items()} for k, s in state["state"].items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Momentum buffers from a checkpoint; θ_outer is the model as loaded (every rank
        adopted θ_outer at the boundary, so the checkpoint's weights are θ_outer)."""
        with torch.no_grad():
            for outer, local in zip(self.outer, self.local, strict=True):
                outer.copy_(local)
        self.optimizer.load_state_dict(state)
        for outer, view in zip(self.outer, self.views, strict=True):
            outer.grad = view  # load_state_dict leaves grads alone; keep the views


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
