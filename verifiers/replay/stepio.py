"""What the parent hands the training replay process and what it answers (``replay.step``):
a ``Request`` (the checkpoint or base, the optimizer state, the updates and their documents)
and a ``Result`` (per update the journal's terms, the numeric settings, the distance), both
as JSON files.

Nothing here imports nscas (docs/format.md §7.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from ..core.errors import VerifierError

FORMAT = "nscas-replay-steps/1"
CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's workspace of a deterministic CUDA run (docs/format.md §7.8)."""
OPTIMIZER_KEYS = ("step", "exp_avg", "exp_avg_sq")
IGNORE = -100


class ReplayStepError(VerifierError):
    """The replay process cannot use what it was given (``subject``: the file or object)."""

    def __init__(self, subject: str, why: str) -> None:
        super().__init__(f"{subject} {why}")
        self.subject = subject
        self.why = why


@dataclass(frozen=True, slots=True, kw_only=True)
class Document:
    """One training document as the run's tokeniser gives it."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    """``IGNORE`` (-100) where unlabelled."""
    weight: int

    @property
    def targets(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Update:
    """One update to make: its number, learning rate and batch (document indices)."""

    step: int
    lr: float
    indices: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """An AdamW parameter group of the published state."""

    params: tuple[str, ...]
    weight_decay: float
    lr: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """Everything the replay process computes from; paths are files the parent keeps."""

    model_dir: str
    """The checkpoint's files (config, weights), loadable by ``from_pretrained``."""
    state_file: str | None
    """The published ``optimizer.safetensors``; None: the run's start (step 0), a fresh AdamW
    whose groups are the model's tensors of two or more dimensions (``weight_decay``) and the
    others (no decay), torch's generator seeded with ``seed`` before the model loads."""
    groups: tuple[Group, ...]
    device: str
    autocast: bool
    """BF16 autocast of the forward passes (a CUDA run replayed on CUDA)."""
    deterministic: bool
    """The run's ``deterministic``: apply docs/format.md §7.8's settings."""
    gradient_checkpointing: bool
    world: int
    micro_batch: int
    clip: float
    lr: float
    betas: tuple[float, float]
    eps: float
    updates: tuple[Update, ...]
    documents: Mapping[int, Document]
    """Every document the updates name, by index."""
    compare: Mapping[int, tuple[str, ...]]
    """Step -> the weight files (safetensors) of that step's checkpoint, for the distance."""
    seconds: float | None
    """Time left for the replay (loading included); later updates are left unmade."""
    weight_decay: float = 0.0
    """A fresh AdamW's decay of the tensors of two or more dimensions (no ``state_file``)."""
    seed: int | None = None
    """``torch.manual_seed`` before the model loads, as the run seeded rank 0 (no
    ``state_file``)."""

    def to_json(self) -> dict[str, Any]:
        value = asdict(self)
        value["documents"] = {str(k): asdict(d) for k, d in self.documents.items()}
        value["compare"] = {str(k): list(v) for k, v in self.compare.items()}
        return {"format": FORMAT, **value}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Request:
        if value.get("format") != FORMAT:
            raise ReplayStepError("the request", f"is not {FORMAT}")
        fields = dict(value)
        del fields["format"]
        fields["groups"] = tuple(Group(params=tuple(g["params"]), weight_decay=g["weight_decay"],
                                       lr=g["lr"]) for g in value["groups"])
        fields["betas"] = (value["betas"][0], value["betas"][1])
        fields["updates"] = tuple(Update(step=u["step"], lr=u["lr"], indices=tuple(u["indices"]))
                                  for u in value["updates"])
        fields["documents"] = {int(k): Document(input_ids=tuple(d["input_ids"]),
                                                labels=tuple(d["labels"]), weight=d["weight"])
                               for k, d in value["documents"].items()}
        fields["compare"] = {int(k): tuple(v) for k, v in value["compare"].items()}
        return cls(**fields)


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    """The numeric settings the replay computed under, read back from torch."""

    deterministic_algorithms: bool
    cublas_workspace_config: str | None
    """``CUBLAS_WORKSPACE_CONFIG`` in the replay process's environment."""
    cuda_started_first: bool
    """Whether CUDA had started in the process before the settings were applied (then the
    workspace setting may not have taken effect); always False in a fresh process."""
    matmul_tf32: bool
    cudnn_tf32: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    attention: str
    """The attention implementation transformers loaded the model with."""
    padding_idx: int | None
    """The input embedding's ``padding_idx`` (the checkpoint config's ``pad_token_id``): its
    row gets no gradient from its occurrences as input."""
    threads: int
    """torch's intra-op threads (the CPU's kernels)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """What one replayed update computed, in the journal's terms."""

    step: int
    loss: float
    grad_norm: float
    parameters: str
    """BLAKE3 hex of the parameters after the update (docs/experiment.md §3.7)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    settings: Settings
    updates: tuple[Measured, ...]
    relative_l2: float | None = None
    max_abs: float | None = None
    """Distance of the parameters after the last replayed update from the weights of that
    step's checkpoint, when the request named it."""
    loaded: str | None = None
    """BLAKE3 hex of the parameters as loaded, before any update (from the run's base only:
    the digest its ranks agreed on at step 0)."""

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> Result:
        return cls(settings=Settings(**value["settings"]),
                   updates=tuple(Measured(**m) for m in value["updates"]),
                   relative_l2=value["relative_l2"], max_abs=value["max_abs"],
                   loaded=value.get("loaded"))
