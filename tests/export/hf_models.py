"""Tiny Llama checkpoints made with plain transformers (config, weights, tokenizer files), and a
store in which two of them share their config and tokenizer: a base imported as `import-hf`
does, and a trained arm that a `train` receipt produced, both named by a commitment."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nscas.cli.import_hf import import_hf
from nscas.models.checkpoints import put_checkpoint
from nscas.objects.digests import Digest
from nscas.store.writer import Store, init_store
from tests.export.conftest import ENVIRONMENT

WORDS = ["<unk>", "<s>", "</s>", "hello", "world", "the", "cat", "sat"]


def save_tiny_llama(path: Path, seed: int) -> Path:
    """A seeded tiny Llama with a word-level tokenizer, saved by ``save_pretrained``."""
    import torch
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=32)
    LlamaForCausalLM(config).save_pretrained(path)
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(path)
    return path


@dataclass(frozen=True, slots=True, kw_only=True)
class Models:
    store: Store
    base: Digest
    """Imported as ``nscas import-hf`` imports (step 0, source import-hf)."""
    trained: Digest
    """Output ``checkpoint`` of ``train``; the same config and tokenizer files as ``base``."""
    train: Digest
    """The receipt that produced ``trained`` (started first)."""
    again: Digest
    """A later succeeded receipt that produced ``trained`` too."""
    failed: Digest
    """A failed receipt of the same action, started earliest (never a producer)."""
    sources: dict[str, Path]
    """The directories the checkpoints were made from, by arm."""


def _receipt(store: Store, action: Digest, outputs: dict[str, Digest], started: str,
             status: str = "succeeded") -> Digest:
    record = {"nscas": "receipt/1", "action": str(action),
              "environment": str(store.put_record(ENVIRONMENT)),
              "outputs": {k: str(v) for k, v in outputs.items()}, "journals": [], "claims": {},
              "started": started, "finished": started, "status": status}
    if status == "failed":
        record.update(outputs={}, error="RuntimeError: out of memory (at train.py:1)")
    return store.put_record(record)


def build_models(root: Path) -> Models:
    store = init_store(root / "source")
    sources = {"seed": save_tiny_llama(root / "seed-model", 0),
               "clean-pair": save_tiny_llama(root / "trained-model", 1)}
    base = import_hf(store, sources["seed"]).checkpoint
    trained = put_checkpoint(store, sources["clean-pair"], step=2, parent=base)
    (root / "code").mkdir()
    (root / "code" / "recipe.py").write_text("def run(ctx):\n    return None\n")
    action = store.put_record({"nscas": "action/1", "recipe": "train@1",
                               "code": str(store.put_tree(root / "code")),
                               "inputs": {"base": str(base)}, "params": {}})
    failed = _receipt(store, action, {}, "2025-01-01T00:00:00Z", status="failed")
    train = _receipt(store, action, {"checkpoint": trained}, "2025-01-02T00:00:00Z")
    again = _receipt(store, action, {"checkpoint": trained}, "2025-01-03T00:00:00Z")
    commitment = store.put_record({"nscas": "commitment/1", "purpose": "candidates",
                                   "subjects": {"seed": str(base), "clean-pair": str(trained),
                                                "training": str(train)},
                                   "previous": None})
    store.ref_set("experiments/coop/clean-pair", trained)
    store.ref_set("experiments/coop/base", base)
    store.ref_set("experiments/coop/commit", commitment)
    return Models(store=store, base=base, trained=trained, train=train, again=again,
                  failed=failed, sources=sources)
