"""GGUF files (llama.cpp's format) to Hugging Face model directories in FP32.

transformers reads a GGUF file and dequantises every tensor (``from_pretrained(dir,
gguf_file=...)``), but refuses ``save_pretrained`` on the model it loaded that way: the model
saved here is a plain one rebuilt from that model's config and state dict. The tokenizer comes
from the file's metadata (vocabulary, merges, special tokens, chat template), saved as
``tokenizer.json`` and friends.
"""

from __future__ import annotations

import contextlib
import gc
import io
from dataclasses import dataclass
from pathlib import Path

from nscas.errors import InvalidInput, RecipeError

MAGIC = b"GGUF"
NOT_PARAMETERS = frozenset({"rope_freqs.weight"})
"""GGUF tensors that are precomputed buffers, not model parameters (Llama 3.1's RoPE
frequencies): they have no counterpart among a Hugging Face model's saved weights."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GgufSummary:
    """What a GGUF file's header says, read without dequantising anything."""

    architecture: str
    """``general.architecture`` (``llama``, ``qwen2``, ...)."""
    tensors: int
    """Tensors in the file, ``NOT_PARAMETERS`` excluded."""
    parameters: int
    """Their elements: the scalars the converted model must hold."""
    quantisations: tuple[str, ...]
    """The tensor types found (``F32``, ``Q4_1``, ...), sorted."""
    has_tokenizer: bool
    """Whether the file holds a vocabulary (``tokenizer.ggml.tokens``)."""


def summarise(path: Path) -> GgufSummary:
    """The header of the GGUF file ``path``; InvalidInput if it is not one transformers reads."""
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None
    if magic != MAGIC:
        raise InvalidInput(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
        field = reader.fields.get("general.architecture")
        architecture = field.contents() if field is not None else None
        kept = [t for t in reader.tensors if t.name not in NOT_PARAMETERS]
        summary = GgufSummary(
            architecture=architecture if isinstance(architecture, str) else "",
            tensors=len(kept), parameters=sum(int(t.n_elements) for t in kept),
            quantisations=tuple(sorted({t.tensor_type.name for t in reader.tensors})),
            has_tokenizer="tokenizer.ggml.tokens" in reader.fields)
    except (ValueError, KeyError, IndexError, TypeError, OSError) as exc:
        raise InvalidInput(f"{path} is not a readable GGUF file ({exc})") from None
    supported = supported_architectures()
    if summary.architecture not in supported:
        raise InvalidInput(f"{path}: GGUF architecture {summary.architecture!r} is not one "
                           f"transformers converts ({', '.join(sorted(supported))})")
    if not summary.has_tokenizer:
        raise InvalidInput(f"{path} holds no tokenizer (no tokenizer.ggml.tokens), so the "
                           "model directory would have none")
    return summary


def supported_architectures() -> frozenset[str]:
    """The GGUF architectures the installed transformers dequantises."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return frozenset(GGUF_SUPPORTED_ARCHITECTURES)


def convert(gguf_path: Path, out_dir: Path) -> Path:
    """Write the model of ``gguf_path`` as an FP32 Hugging Face directory ``out_dir`` (new):
    ``config.json``, ``model.safetensors``, the generation config and the tokenizer files."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nscas.recipes.init.presets import _quiet

    where, name = str(gguf_path.parent), gguf_path.name
    try:
        # transformers' GGUF loader draws its own tqdm bar on stderr; only the CLI shows progress.
        with _quiet(), contextlib.redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name,
                                                          dtype=torch.float32)
    except (ValueError, KeyError, TypeError, OSError, RuntimeError) as exc:
        raise RecipeError(f"transformers cannot load {name}: {exc}") from None
    config = loaded.config
    # The plain model must not claim to be GGUF-quantised, or loading it would look for the file.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # The plain model is made without storage and takes the loaded model's tensors as they are
    # (assign): the weights are in memory once, not twice (7.1 GB in FP32 for 1.8B parameters).
    with torch.no_grad():
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    # A GGUF tokenizer knows no length limit and would save a 31-digit one (beyond the 2**53 of
    # strict JSON readers): its limit is the model's context.
    tokenizer.model_max_length = config.max_position_embeddings
    with _quiet():
        plain.save_pretrained(out_dir, max_shard_size="1000GB")
        tokenizer.save_pretrained(out_dir)
    del plain, loaded
    gc.collect()  # before the caller loads the saved model: not two copies at once
    if not (out_dir / "model.safetensors").is_file():
        raise RecipeError(f"save_pretrained did not write model.safetensors in {out_dir}")
    return out_dir
