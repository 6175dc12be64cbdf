"""Choosing each next token, as both decoders do: FP32 logits, and the callbacks through which a
server samples (``Chooser``) and streams (``TokenSink``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

Chooser = Callable[[torch.Tensor, Sequence[int]], torch.Tensor]
"""(FP32 logits of the live rows [live, vocab], the prompt index of each) -> their next tokens.
A server's sampling; without one, the next token is the argmax."""
TokenSink = Callable[[int, int], bool]
"""(prompt index, the token just chosen for it) -> False to end that row now. Called as each
token is chosen, so that a server can stream it and stop at a stop string."""


def fp32_logits(head: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
    """FP32 logits even under BF16 autocast: BF16 logits tie far more often."""
    with torch.autocast(hidden.device.type, enabled=False):
        bias = None if head.bias is None else head.bias.float()
        return F.linear(hidden.float(), head.weight.float(), bias)
