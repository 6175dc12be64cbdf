"""The typed parameters of recipe ``train`` and the spec file the wrapper hands to the workers.

Defaults are the published values of docs/experiment.md §3. Every check that can be made without a
process group happens here, so bad params fail before any rank starts. Params are parsed by
``nscas.runs.config.parse_params`` only: from the recipe file by the runner, and from the spec file
by each rank.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nscas.errors import InvalidInput
from nscas.runs.config import params_to_json, parse_params

MIN_WEIGHT = 1
MAX_WEIGHT = 16
"""Loss weights are whole numbers in this range; the published run used 8 and 1."""

SPEC_FORMAT = "train-spec/1"
"""The ``format`` member of a worker spec file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainParams:
    """Parameters of one training run (docs/experiment.md §3); the defaults are the published run."""

    steps: int = 128
    """Optimizer updates to make."""
    batch: int = 8
    """Documents per update, across all ranks (the global batch)."""
    lr: float = 3e-5
    """Peak learning rate, reached after warmup; cosine decay then ends at 0.1 × lr."""
    warmup: int = 8
    """Updates of linear warmup: update s (0-based) uses lr·(s+1)/warmup while s < warmup."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.01
    """AdamW weight decay, applied only to parameter tensors with at least two dimensions."""
    clip: float = 1.0
    """Maximum global gradient norm; gradients are scaled down to it when larger."""
    schedule_seed: int = 20260913
    """Seed of the document schedule (``random.Random(seed)`` shuffles of the documents)."""
    checkpoint_steps: tuple[int, ...] = (64, 128)
    """Steps after which a checkpoint is written; the final step is always written too."""
    grounded_weight: int = 8
    """Loss weight of grounded task documents (train or damaged)."""
    replay_weight: int = 1
    """Loss weight of replay conversations."""
    max_length: int = 1024
    """Longest document in tokens; a longer one is an error (never truncated)."""
    world: int = 1
    """Total number of ranks (processes) across all nodes."""
    device: str = "cpu"
    """``cpu`` (gloo, FP32 throughout) or ``cuda`` (NCCL, BF16 autocast, one GPU per rank)."""
    deterministic: bool = True
    """Deterministic algorithms on and TF32 off."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory (same mathematics)."""
    bucket_mb: int = 25
    """Size of DDP's gradient buckets in MiB (DDP's own default): gradients are all-reduced a
    bucket at a time while the backward pass goes on. Two ranks sum the same two values
    whatever the size; more ranks may round differently, so it is part of the run's identity."""
    micro_batch: int = 1
    """Documents per forward/backward pass on each rank. 1 is docs/experiment.md §3's method (one
    backward per document). More stacks up to that many of a rank's documents into one
    right-padded forward: the same objective, several times faster on a GPU, other rounding,
    and activation memory for that many documents at once."""
    compile: bool = False
    """Run the forward and backward passes through ``torch.compile`` (needs ``micro_batch`` >
    1): every pass is padded to one shape, ``micro_batch`` rows of the longest document's
    length rounded up to 64, so one compiled graph serves every update and a small model's
    many kernel launches become few. The same objective; other kernels and other rounding."""
    nnodes: int = 1
    """Number of hosts; each runs world / nnodes ranks."""
    node_rank: int = 0
    """Index of this host among the nnodes hosts."""
    rdzv_endpoint: str = "127.0.0.1:0"
    """HOST:PORT of the c10d rendezvous; port 0 picks a free port (single host only)."""
    timeout_seconds: int = 60
    """Process-group timeout: a rank that stops answering stops the others within this."""
    checkpoint_timeout_seconds: int = 1800
    """How long ranks wait for each other around slow phases (loading, rank 0 writing a
    checkpoint); a rank that dies is still noticed at once."""
    parameter_digests: int = 1
    """Every this many updates (step s with s % N == 0) the journal's step entry carries
    ``parameters``: the BLAKE3 digest of the parameters after that update, the one ranks agree
    on (docs/experiment.md §3.7); 0: none. A replay of training (``nscas verify
    --replay-steps``) compares its own digests with these."""
    publish_state: tuple[int, ...] = ()
    """Checkpoint steps whose optimizer and RNG state is published with the checkpoint (its
    ``state`` member, docs/format.md §3.3): safetensors and JSON, not a pickle, so a verifier
    can replay the updates after it."""
    sync: str = "ddp"
    """How ranks combine their work (docs/experiment.md §3.3 and §3.13): ``ddp``, one
    synchronous update per step, gradients all-reduced by DDP (the published method); or
    ``diloco``, every rank a learner of its own for ``inner_steps`` updates, then an outer
    step: the ranks average their pseudo-gradients (θ_outer − θ_local) with one all-reduce,
    an outer SGD with Nesterov momentum updates θ_outer, and every rank adopts it."""
    inner_steps: int = 1
    """DiLoCo's H: inner updates between outer steps (``sync = "diloco"`` only); ``steps`` and
    every checkpoint step must be multiples of it."""
    outer_lr: float = 0.7
    """Learning rate of the outer SGD (``sync = "diloco"`` only; OpenDiLoCo's 0.7)."""
    outer_momentum: float = 0.9
    """Nesterov momentum of the outer SGD (``sync = "diloco"`` only; OpenDiLoCo's 0.9); 0 is
    plain SGD."""
    optimizer: str = "adamw"
    """The optimizer of every update (DiLoCo's inner one): ``adamw`` (the published method) or
    ``sgd`` (plain SGD, no momentum, the same weight-decay groups, coupled decay)."""

    def __post_init__(self) -> None:
        _check_int(self, "steps", low=1)
        _check_int(self, "batch", low=1)
        _check_int(self, "warmup", low=0)
        _check_int(self, "max_length", low=2)
        _check_int(self, "world", low=1)
        _check_int(self, "nnodes", low=1)
        _check_int(self, "node_rank", low=0, high=self.nnodes - 1)
        _check_int(self, "timeout_seconds", low=1)
        _check_int(self, "checkpoint_timeout_seconds", low=1)
        _check_int(self, "schedule_seed", low=0)
        for name in ("grounded_weight", "replay_weight"):
            _check_int(self, name, low=MIN_WEIGHT, high=MAX_WEIGHT)
        for name in ("lr", "eps", "clip"):
            value = getattr(self, name)
            if not _is_number(value) or not value > 0:
                raise InvalidInput(f"{name} must be a positive number, not {value!r}")
        if not _is_number(self.weight_decay) or self.weight_decay < 0:
            raise InvalidInput(f"weight_decay must be >= 0, not {self.weight_decay!r}")
        if (
            not isinstance(self.betas, tuple)
            or len(self.betas) != 2
            or not all(_is_number(b) and 0 <= b < 1 for b in self.betas)
        ):
            raise InvalidInput(f"betas must be two numbers in [0, 1), not {self.betas!r}")
        if not isinstance(self.checkpoint_steps, tuple) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in self.checkpoint_steps
        ):
            raise InvalidInput(
                f"checkpoint_steps must be a list of integers, not {self.checkpoint_steps!r}"
            )
        if list(self.checkpoint_steps) != sorted(set(self.checkpoint_steps)) or any(
            not 1 <= s <= self.steps for s in self.checkpoint_steps
        ):
            raise InvalidInput(
                f"checkpoint_steps {list(self.checkpoint_steps)} must be increasing "
                f"steps between 1 and steps ({self.steps})"
            )
        _check_int(self, "parameter_digests", low=0)
        if not isinstance(self.publish_state, tuple) or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in self.publish_state
        ):
            raise InvalidInput(
                f"publish_state must be a list of integers, not {self.publish_state!r}"
            )
        if list(self.publish_state) != sorted(set(self.publish_state)) or any(
            s not in self.checkpoint_set for s in self.publish_state
        ):
            raise InvalidInput(
                f"publish_state {list(self.publish_state)} must be increasing checkpoint steps "
                f"(checkpoint_steps and the final step {self.steps})"
            )
        self._check_sync()
        if self.batch % self.world:
            raise InvalidInput(
                f"batch ({self.batch}) is not divisible by world ({self.world}): "
                "every rank must take the same number of documents"
            )
        _check_int(self, "micro_batch", low=1)
        _check_int(self, "bucket_mb", low=1, high=4096)
        if self.micro_batch > self.batch // self.world:
            raise InvalidInput(
                f"micro_batch ({self.micro_batch}) is more than a rank's documents "
                f"per update (batch / world = {self.batch // self.world})"
            )
        if self.compile and self.micro_batch < 2:
            raise InvalidInput(
                "compile needs micro_batch of 2 or more: one pass per document has as many "
                "shapes as documents, and each would be compiled anew"
            )
        if self.world % self.nnodes:
            raise InvalidInput(
                f"world ({self.world}) is not divisible by nnodes ({self.nnodes})"
            )
        if self.device not in ("cpu", "cuda"):
            raise InvalidInput(f"device must be 'cpu' or 'cuda', not {self.device!r}")
        for name in ("deterministic", "gradient_checkpointing"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInput(f"{name} must be true or false")
        host, sep, port = self.rdzv_endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise InvalidInput(
                f"rdzv_endpoint must be HOST:PORT, not {self.rdzv_endpoint!r}"
            )
        if self.nnodes > 1 and int(port) == 0:
            raise InvalidInput("rdzv_endpoint needs a fixed port when nnodes > 1")

    def _check_sync(self) -> None:
        if self.sync not in ("ddp", "diloco"):
            raise InvalidInput(f"sync must be 'ddp' or 'diloco', not {self.sync!r}")
        if self.optimizer not in ("adamw", "sgd"):
            raise InvalidInput(f"optimizer must be 'adamw' or 'sgd', not {self.optimizer!r}")
        if self.publish_state and self.optimizer != "adamw":
            raise InvalidInput("publish_state needs optimizer = 'adamw': a published state is "
                               "AdamW's, and a replay of training replays AdamW")
        _check_int(self, "inner_steps", low=1)
        if not _is_number(self.outer_lr) or not self.outer_lr > 0:
            raise InvalidInput(f"outer_lr must be a positive number, not {self.outer_lr!r}")
        if not _is_number(self.outer_momentum) or not 0 <= self.outer_momentum < 1:
            raise InvalidInput(f"outer_momentum must be a number in [0, 1), "
                               f"not {self.outer_momentum!r}")
        if self.sync == "ddp":
            defaults = {"inner_steps": 1, "outer_lr": 0.7, "outer_momentum": 0.9}
            changed = [n for n, v in defaults.items() if getattr(self, n) != v]
            if changed:
                verb = "apply" if len(changed) > 1 else "applies"
                raise InvalidInput(f"{', '.join(changed)} {verb} to sync = 'diloco' only; "
                                   "this run has sync = 'ddp'")
            return
        h = self.inner_steps
        if self.steps % h:
            raise InvalidInput(f"steps ({self.steps}) is not a multiple of inner_steps ({h}): "
                               "a diloco run ends on an outer step")
        off = [s for s in self.checkpoint_steps if s % h]
        if off:
            raise InvalidInput(f"checkpoint_steps {off} are not multiples of inner_steps ({h}): "
                               "a diloco checkpoint lies on an outer-step boundary")
        if self.publish_state:
            raise InvalidInput("publish_state is not supported with sync = 'diloco': every rank "
                               "holds its own inner optimizer state, which no replay rebuilds")

    @property
    def diloco(self) -> bool:
        return self.sync == "diloco"

    @property
    def nproc_per_node(self) -> int:
        return self.world // self.nnodes

    @property
    def checkpoint_set(self) -> frozenset[int]:
        """The steps that get a checkpoint: the listed ones and the final step."""
        return frozenset((*self.checkpoint_steps, self.steps))

    def identity(self) -> dict[str, Any]:
        """The params that decide the trained result (not where this host sits), as JSON values."""
        out = params_to_json(self)
        for name in ("node_rank", "rdzv_endpoint", "timeout_seconds", "checkpoint_timeout_seconds"):
            del out[name]
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSpec:
    """What the recipe wrapper hands every rank, as a JSON file (``train-spec/1``)."""

    base_dir: str
    """The materialised base model: an HF directory (config.json + safetensors)."""
    documents: tuple[str, ...]
    """Tokenised document JSONL files, read in order (train or damaged tasks, then replay)."""
    output_dir: str
    """Where ranks write journals, checkpoints and results; also what a resume looks in."""
    tokenizer_dir: str
    """The tokenizer directory whose files every checkpoint directory carries."""
    params: TrainParams = field(default_factory=TrainParams)
    """The training parameters."""
    run_key: str | None = None
    """Names the run for resume checks (e.g. the action ID); None: derived from the inputs."""
    stored_before_next: bool = False
    """Write a checkpoint only once every one announced before it is stored (``committed.json``
    lists it): the work area then holds at most the latest stored checkpoint and the one being
    written, whatever the storing costs, which is what train declares to disk admission."""

    def __post_init__(self) -> None:
        if not self.documents:
            raise InvalidInput("train spec lists no document files")

    def to_json(self) -> str:
        body = {
            "format": SPEC_FORMAT,
            "base_dir": self.base_dir,
            "documents": list(self.documents),
            "output_dir": self.output_dir,
            "params": params_to_json(self.params),
            "tokenizer_dir": self.tokenizer_dir,
            "run_key": self.run_key,
            "stored_before_next": self.stored_before_next,
        }
        return json.dumps(body, indent=1, sort_keys=True)

    def write(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> WorkerSpec:
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"cannot read train spec {path}: {exc}") from exc
        if not isinstance(body, dict) or body.get("format") != SPEC_FORMAT:
            raise InvalidInput(f"{path} is not a {SPEC_FORMAT} file")
        try:
            return cls(
                base_dir=body["base_dir"],
                documents=tuple(body["documents"]),
                output_dir=body["output_dir"],
                params=parse_params(TrainParams, body["params"], str(path)),
                tokenizer_dir=body["tokenizer_dir"],
                run_key=body.get("run_key"),
                stored_before_next=bool(body.get("stored_before_next", False)),
            )
        except (KeyError, TypeError) as exc:
            raise InvalidInput(f"train spec {path} is incomplete: {exc}") from exc


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_int(params: TrainParams, name: str, *, low: int, high: int | None = None) -> None:
    value = getattr(params, name)
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (
        high is not None and value > high
    ):
        span = f"between {low} and {high}" if high is not None else f">= {low}"
        raise InvalidInput(f"{name} must be an integer {span}, not {value!r}")
