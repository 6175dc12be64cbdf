"""Is a retained answer a greedy decoding of the checkpoint, up to near ties? (docs/format.md §7.8)

One forward pass over a task's prompt and its retained answer (teacher forcing) gives, at every
answer position, the logits the checkpoint computes after the retained prefix. Greedy decoding
(docs/experiment.md §4.2) chose the highest-scoring token there; the retained token's
*deficit* is the largest logit minus its own (0 where it is the choice). Kernels of another
shape, another device or another precision move logits by float noise, so a deficit within a
tolerance of that noise is a near tie that the run may have broken the other way: the answer
is then *consistent*, not *identical*. A deficit beyond it is a token the checkpoint did not
choose. The stopping rule is checked with it: an answer ends at its first stop token (which is
then its last token, and must itself be the greedy choice) or after ``max_new_tokens``.

The tolerance is a number of units in the last place (ulps) of the precision whose rounding
moved the logits, at the magnitude of that position's largest logit (at least 1): two BF16 ulps
when a BF16-autocast run is replayed in BF16, 256 FP32 ulps (about 2e-5 relative) when an FP32
run is replayed in FP32. A BF16 run replayed in FP32 (a GPU run on a CPU) differs by the
rounding of every weight and product: deficits beyond two BF16 ulps but within 32 are then
reported, not rechecked, rather than passed or failed; beyond 32 they fail.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Precision = Literal["bf16", "fp32"]
Verdict = Literal["identical", "consistent", "unexplained", "failed"]

MANTISSA: dict[str, int] = {"bf16": 7, "fp32": 23}
"""Explicit mantissa bits: an ulp of x is 2^(floor(log2 |x|) - bits)."""
TOLERANCE_ULPS: dict[str, int] = {"bf16": 2, "fp32": 256}
"""Deficits within this many ulps of the noise precision are near ties."""
CROSS_BOUND_ULPS = 32
"""A BF16 run replayed in FP32: deficits beyond the BF16 tolerance and within this many BF16
ulps are not rechecked (the replay cannot tell them from BF16 rounding); beyond, they fail."""


def ulp(x: float, precision: str) -> float:
    """One unit in the last place of ``precision`` at the magnitude of ``x`` (at least 1)."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1.0))) - MANTISSA[precision])


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerance:
    """How far below the greedy logit a retained token may lie, for a run's precision and the
    replay's (docs/format.md §7.8)."""

    run: Precision
    replay: Precision

    @property
    def noise(self) -> Precision:
        """The coarser precision: its rounding is what moves the logits."""
        return "bf16" if "bf16" in (self.run, self.replay) else "fp32"

    @property
    def cross(self) -> bool:
        return self.run != self.replay

    def within(self, top: float) -> float:
        """The largest deficit of a near tie where the largest logit is ``top``."""
        return TOLERANCE_ULPS[self.noise] * ulp(top, self.noise)

    def bound(self, top: float) -> float:
        """The largest deficit that does not fail (beyond ``within``: not rechecked)."""
        ulps = CROSS_BOUND_ULPS if self.cross else TOLERANCE_ULPS[self.noise]
        return ulps * ulp(top, self.noise)

    def describe(self) -> str:
        name = self.noise.upper()
        text = f"{TOLERANCE_ULPS[self.noise]} {name} ulps of the largest logit"
        if self.cross:
            text += f" (not rechecked up to {CROSS_BOUND_ULPS})"
        return text


@dataclass(frozen=True, slots=True, kw_only=True)
class Deviation:
    """An answer position whose retained token is not the greedy choice."""

    position: int
    retained: int
    greedy: int
    deficit: float
    """The largest logit minus the retained token's (0 on an exact tie)."""
    tolerance: float
    bound: float

    def describe(self) -> str:
        return (f"answer token {self.position} is {self.retained}, the greedy choice "
                f"{self.greedy} leads it by {self.deficit:.4g} (tolerance {self.tolerance:.3g})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    """One replayed answer's verdict."""

    task: str
    verdict: Verdict
    deviations: tuple[Deviation, ...] = ()
    """Every position where the retained token is not the greedy choice, in order."""
    stopping: str | None = None
    """How the answer breaks the stopping rule, if it does."""

    @property
    def worst(self) -> Deviation | None:
        """The deviation to name: the first that fails, else the largest relative to its
        tolerance."""
        failing = [d for d in self.deviations if d.deficit > d.bound]
        if failing:
            return failing[0]
        return max(self.deviations, key=lambda d: d.deficit / d.tolerance, default=None)

    def describe(self) -> str:
        worst = self.worst
        if self.stopping is not None:
            return f"{self.task}: {self.stopping}"
        if worst is None:
            return f"{self.task}: identical"
        if self.verdict == "consistent":
            return (f"{self.task}: {len(self.deviations)} near tie(s), the largest: "
                    f"{worst.describe()}")
        if self.verdict == "unexplained":
            return (f"{self.task}: {worst.describe()}; within {worst.bound:.3g}, which a BF16 "
                    "run replayed in FP32 can explain (replay with --device cuda to recheck)")
        return f"{self.task}: {worst.describe()}, not a near tie"


def stopping_problem(out: Sequence[int], stops: set[int], max_new_tokens: int) -> str | None:
    """How ``out`` breaks the stopping rule (docs/experiment.md §4.2), or None."""
    if len(out) > max_new_tokens:
        return f"{len(out)} answer tokens, beyond max_new_tokens {max_new_tokens}"
    early = next((i for i, t in enumerate(out[:-1]) if t in stops), None)
    if early is not None:
        return (f"answer token {early} is the stop token {out[early]}, where generation ends, "
                f"yet {len(out) - early - 1} tokens follow it")
    if out[-1] not in stops and len(out) < max_new_tokens:
        return (f"the answer ends after {len(out)} tokens without a stop token, before "
                f"max_new_tokens {max_new_tokens}")
    return None


def judge(task: str, out: Sequence[int], scores: Any, tolerance: Tolerance,
          stopping: str | None = None) -> Answer:
    """The verdict on ``out`` given ``scores``, the FP32 logits [len(out), vocab] after each
    retained prefix."""
    import torch

    kept = torch.tensor(list(out), device=scores.device)[:, None]
    top, greedy = scores.max(dim=-1)  # argmax: the first index on a tie
    deficit = (top - scores.gather(-1, kept)[:, 0]).tolist()
    deviations = tuple(
        Deviation(position=i, retained=want, greedy=got, deficit=gap,
                  tolerance=tolerance.within(peak), bound=tolerance.bound(peak))
        for i, (want, got, gap, peak) in enumerate(zip(out, greedy.tolist(), deficit,
                                                       top.tolist(), strict=True))
        if want != got)
    verdict: Verdict
    if stopping is not None or any(d.deficit > d.bound for d in deviations):
        verdict = "failed"
    elif any(d.deficit > d.tolerance for d in deviations):
        verdict = "unexplained"
    else:
        verdict = "consistent" if deviations else "identical"
    return Answer(task=task, verdict=verdict, deviations=deviations, stopping=stopping)


def answer_scores(model: Any, prompt: Sequence[int], out: Sequence[int], device: str,
                  precision: Precision) -> Any:
    """FP32 logits after each retained prefix of ``out``: one pass over ``prompt`` and ``out``
    but its last token, unpadded; the decoder in ``precision``, the output embedding applied to
    its last hidden state in FP32 (autocast off), as the run computed them."""
    import torch
    import torch.nn.functional as F

    ids = torch.tensor([[*prompt, *out[:-1]]], dtype=torch.long, device=device)
    head = model.get_output_embeddings()
    with torch.no_grad(), computing(device, precision):
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
        hidden = hidden[len(prompt) - 1:]
        with torch.autocast(hidden.device.type, enabled=False):
            bias = None if head.bias is None else head.bias.float()
            return F.linear(hidden.float(), head.weight.float(), bias)


@contextlib.contextmanager
def computing(device: str, precision: Precision) -> Iterator[None]:
    """BF16 autocast on CUDA for ``bf16``; FP32 products without TF32 for ``fp32``."""
    import torch

    if device != "cuda":
        yield
    elif precision == "bf16":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            yield
    else:
        saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = saved
