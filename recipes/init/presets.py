"""Named Llama presets built from configs with seeded initialisation, and the HF directory format.

Weights are never downloaded: a model is ``torch.manual_seed(seed)`` followed by the model's
own initialisation, always on the CPU in FP32, so the same preset, seed and vocabulary give
bit-identical weights on any machine (moving them to a GPU afterwards changes nothing).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)
from transformers.utils import logging as hf_logging

from nscas.errors import DestinationExists, InvalidInput, RecipeError

WEIGHTS_FILE = "model.safetensors"
"""The one weights file an HF directory written here holds (never sharded)."""

_MODEL_FILES = frozenset({"config.json", WEIGHTS_FILE, "generation_config.json"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    """The architecture of a Llama-family causal LM; the vocabulary may come from the tokenizer."""

    name: str
    """The name callers use (``llama-tiny``)."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the SwiGLU MLP."""
    num_hidden_layers: int
    """Number of decoder layers."""
    num_attention_heads: int
    """Query heads per layer."""
    num_key_value_heads: int
    """Key/value heads per layer (equal to the query heads: no grouped-query attention)."""
    max_position_embeddings: int
    """Longest sequence the rotary embedding is configured for."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding."""
    rms_norm_eps: float = 1e-5
    """Epsilon of every RMSNorm."""
    tie_word_embeddings: bool = True
    """Whether the output projection shares the input embedding matrix."""
    vocab_size: int | None = None
    """A fixed, published vocabulary size (the embedding is padded up to it); ``None``: the
    tokenizer's size."""

    def config(self, *, vocab_size: int) -> LlamaConfig:
        """The ``LlamaConfig`` of this preset for a tokenizer of ``vocab_size`` entries."""
        if vocab_size < 1:
            raise InvalidInput(f"preset {self.name}: vocab_size must be positive, not {vocab_size}")
        if self.vocab_size is not None and vocab_size > self.vocab_size:
            raise InvalidInput(
                f"preset {self.name} has a fixed vocabulary of {self.vocab_size} entries; "
                f"a tokenizer of {vocab_size} entries does not fit"
            )
        # transformers 5 takes rope_theta as a legacy key (into rope_parameters), 4.x as an
        # argument: 5's signature lacks it.
        return LlamaConfig(  # type: ignore[call-arg]
            vocab_size=self.vocab_size if self.vocab_size is not None else vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            hidden_act="silu",
            initializer_range=0.02,
            attention_bias=False,
            mlp_bias=False,
        )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        # About 1M parameters with a 2,048-entry tokenizer: fast enough for CPU tests.
        Preset(
            name="llama-tiny",
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=2048,
        ),
        # 34M parameters with a 2,048-entry tokenizer, 59M with 49,152: GPU experiments.
        Preset(
            name="llama-small",
            hidden_size=512,
            intermediate_size=2048,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=8,
            max_position_embeddings=2048,
        ),
        # The published SmolLM2-1.7B architecture: 1,711,376,384 parameters in 218 tensors.
        Preset(
            name="smollm2-1.7b",
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=24,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=8192,
            rope_theta=130000.0,
            rms_norm_eps=1e-5,
            vocab_size=49152,
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; an unknown name is an input error listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise InvalidInput(f"unknown model preset {name!r}; known presets: {known}") from None


def build_model(
    preset: str,
    *,
    vocab_size: int,
    seed: int,
    device: str | torch.device = "cpu",
    meta: bool = False,
) -> LlamaForCausalLM:
    """A freshly initialised FP32 model of ``preset``; ``meta=True`` allocates no storage."""
    config = get_preset(preset).config(vocab_size=vocab_size)
    if meta:
        with torch.device("meta"):
            return LlamaForCausalLM(config)
    # Initialise on the CPU whatever the target device: CUDA's generator draws other numbers,
    # and the same seed must give the same weights on every machine.
    torch.manual_seed(seed)
    with torch.device("cpu"):
        # transformers' stubs type PreTrainedModel.to through a decorator that wants the model.
        model = LlamaForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]
    return model.to(device)


def parameter_count(model: torch.nn.Module) -> tuple[int, int]:
    """(number of parameter tensors, number of scalars); tied weights count once."""
    params = list(model.parameters())
    return len(params), sum(p.numel() for p in params)


def save_hf_dir(model: PreTrainedModel, tokenizer_dir: Path, out_dir: Path, *,
                trained: bool = False) -> Path:
    """Write ``model`` and the tokenizer files of ``tokenizer_dir`` as one HF model directory.

    The model's config and generation config are set to the tokenizer's special token ids
    (greedy decoding stopping at its eos token), except, for a ``trained`` model (a training
    checkpoint), the config's ``pad_token_id``: a model loaded from the directory makes it its
    embedding's ``padding_idx``, whose row learns nothing from its occurrences as input, so it
    stays the ``padding_idx`` this model computed with, or a run resumed or replayed from the
    checkpoint would train otherwise than the run did. ``out_dir`` must not exist or be empty.
    Returns ``out_dir``.
    """
    tokenizer_dir, out_dir = Path(tokenizer_dir), Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise DestinationExists(str(out_dir))
    tokenizer = _load_tokenizer(tokenizer_dir)
    if len(tokenizer) > model.config.vocab_size:
        raise InvalidInput(
            f"tokenizer in {tokenizer_dir} has {len(tokenizer)} entries but the model's "
            f"embedding has only {model.config.vocab_size} rows"
        )
    clashes = sorted(p.name for p in tokenizer_dir.iterdir() if p.name in _MODEL_FILES)
    if clashes:
        raise InvalidInput(f"tokenizer directory {tokenizer_dir} holds model files: {clashes}")

    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    configured = dict(special)
    if trained:
        configured["pad_token_id"] = model.get_input_embeddings().padding_idx
    for key, value in configured.items():
        setattr(model.config, key, value)
    model.generation_config = GenerationConfig(do_sample=False, **special)

    out_dir.mkdir(parents=True, exist_ok=True)
    # transformers 5 always writes safetensors; a shard limit above any preset keeps it to the
    # single model.safetensors file that checkpoints expect.
    with _quiet():
        model.save_pretrained(out_dir, max_shard_size="1000GB")
    if not (out_dir / WEIGHTS_FILE).is_file():
        raise RecipeError(f"save_pretrained did not write {WEIGHTS_FILE} in {out_dir}")
    # Copy the tokenizer files byte for byte (not re-saved) so their object IDs stay the ones
    # the tokenizer recipe produced.
    for path in sorted(tokenizer_dir.iterdir()):
        if path.is_file():
            shutil.copyfile(path, out_dir / path.name)
    return out_dir


def load_hf_dir(
    path: Path,
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
) -> tuple[PreTrainedModel, Any]:
    """(model, tokenizer) from an HF directory; ``dtype=None`` keeps the stored dtype."""
    path = Path(path)
    if not path.is_dir():
        raise InvalidInput(f"model directory {path} does not exist")
    missing = [name for name in ("config.json", WEIGHTS_FILE) if not (path / name).is_file()]
    if missing:
        raise InvalidInput(
            f"{path} is not a model directory written by nscas: missing {', '.join(missing)}"
        )
    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype if dtype is not None else "auto"
        )
    return model.to(device), _load_tokenizer(path)  # type: ignore[arg-type]  # as above


def _load_tokenizer(path: Path) -> Any:
    if not (path / "tokenizer.json").is_file():
        raise InvalidInput(f"no tokenizer.json in {path}")
    return AutoTokenizer.from_pretrained(path)


@contextmanager
def _quiet() -> Iterator[None]:
    """No transformers progress bars on stderr: only the CLI shows progress."""
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
