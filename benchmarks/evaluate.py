"""Batched against one-at-a-time greedy generation, on the same prompts, for the same tokens.

Prints, side by side, the median seconds and tokens/s of generating every prompt one at a time
and in batches (of 64 by default), their ratio, and whether both produced identical tokens.
The model is an HF directory (--model-dir) or built inline from a seeded config: --preset tiny
(about 1M parameters, for CPU) or small (about 38M, hidden 512, 8 layers, vocabulary 8192, for
one GPU). Prompts are seeded random token ids of lengths like the evaluation's prompts.

Examples:
    .venv/bin/python benchmarks/evaluate.py --device cpu --preset tiny --prompts 64
    python3 benchmarks/evaluate.py --device cuda --preset small --prompts 64
    python3 benchmarks/evaluate.py --device cuda --model-dir path/to/checkpoint
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, models

from nscas.recipes.common.generate import Generation, generate_greedy

PAD, EOT = 0, 1

# Shapes of the project's llama-tiny and llama-small presets, repeated here so that this
# script needs nothing but a config to run.
PRESETS = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 2048,
    },
    "small": {
        "hidden_size": 512,
        "intermediate_size": 2048,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 8192,
    },
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Timed:
    """One mode's runs: every run's seconds and the generations of the last run."""

    seconds: tuple[float, ...]
    generations: tuple[Generation, ...]
    repeatable: bool
    """Every run produced the same tokens as the first."""

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def tokens(self) -> int:
        return sum(len(g.output_ids) for g in self.generations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model-dir", type=Path, help="an HF model directory (with tokenizer)")
    source.add_argument("--preset", choices=sorted(PRESETS), help="build a seeded model inline")
    parser.add_argument("--prompts", type=int, default=64, help="number of prompts")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode (median)")
    parser.add_argument("--min-length", type=int, default=32, help="shortest prompt, tokens")
    parser.add_argument("--max-length", type=int, default=160, help="longest prompt, tokens")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=20260913)
    parser.add_argument(
        "--precision",
        choices=("bf16", "fp32", "both"),
        default="both",
        help="CUDA: BF16 autocast, FP32 without TF32, or one table for each (CPU is FP32 anyway)",
    )
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if args.model_dir is not None:
        model, tokenizer, eos_ids, described = load_model(args.model_dir)
    else:
        model, tokenizer, eos_ids, described = build_model(args.preset or "tiny", args.seed)
    model = model.to(args.device).eval()
    parameters = sum(p.numel() for p in model.parameters())
    prompts = make_prompts(
        args.prompts, args.min_length, args.max_length, model.config.vocab_size, eos_ids, args.seed
    )

    print(
        f"model: {described}, {parameters:,} parameters; device {args.device}; "
        f"torch threads {args.threads}"
    )
    precisions = ("bf16", "fp32") if args.precision == "both" else (args.precision,)
    if args.device == "cpu":
        precisions = ("fp32",)
    for precision in precisions:
        compare(args, model, tokenizer, prompts, eos_ids, precision)


def compare(
    args: argparse.Namespace,
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    eos_ids: set[int],
    precision: str,
) -> None:
    """One table: one-at-a-time against batched generation at ``precision``."""

    def run(rows: list[list[int]], batch_size: int, new_tokens: int) -> list[Generation]:
        return generate_greedy(
            model,
            tokenizer,
            rows,
            max_new_tokens=new_tokens,
            batch_size=batch_size,
            eos_ids=eos_ids,
            device=args.device,
            precision=precision,  # type: ignore[arg-type]
        )

    run(prompts[:2], 2, 4)  # warm-up, unmeasured: first kernels, allocator, caches
    # Alternate the modes so that both see the same background load on a shared machine.
    single, batched = timed(
        [
            lambda: run(prompts, 1, args.max_new_tokens),
            lambda: run(prompts, args.batch_size, args.max_new_tokens),
        ],
        args.repeats,
        args.device,
    )

    same = sum(
        a.output_ids == b.output_ids
        for a, b in zip(single.generations, batched.generations, strict=True)
    )
    lengths = [len(p) for p in prompts]
    print()
    print(
        f"precision {precision}: {len(prompts)} prompts of {min(lengths)}..{max(lengths)} "
        f"tokens; max_new_tokens {args.max_new_tokens}; median of {args.repeats} runs"
    )
    header = f"batched ({args.batch_size})"
    print(f"{'':<20}{'one-at-a-time':>16}{header:>16}")
    print(f"{'seconds':<20}{single.median:>16.3f}{batched.median:>16.3f}")
    print(
        f"{'tokens/s':<20}{single.tokens / single.median:>16.1f}"
        f"{batched.tokens / batched.median:>16.1f}"
    )
    print(f"{'tokens generated':<20}{single.tokens:>16}{batched.tokens:>16}")
    print(f"{'runs (seconds)':<20}{fmt(single.seconds):>16}{fmt(batched.seconds):>16}")
    print(f"{'runs agree':<20}{yes(single.repeatable):>16}{yes(batched.repeatable):>16}")
    print(f"ratio (one-at-a-time seconds / batched seconds): {single.median / batched.median:.2f}x")
    print(f"outputs identical: {yes(same == len(prompts))} ({same}/{len(prompts)} rows)")
    ended = sum(g.ended_with_eos for g in batched.generations)
    limited = sum(g.hit_token_limit for g in batched.generations)
    print(f"rows ended with end-of-turn: {ended}; rows at the token limit: {limited}")


def timed(modes: list[Any], repeats: int, device: str) -> list[Timed]:
    """Run each mode ``repeats`` times, alternating between modes, timing every run."""
    seconds: list[list[float]] = [[] for _ in modes]
    tokens: list[set[tuple[tuple[int, ...], ...]]] = [set() for _ in modes]
    generations: list[list[Generation]] = [[] for _ in modes]
    for _ in range(repeats):
        for index, generate in enumerate(modes):
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            generations[index] = generate()
            if device == "cuda":
                torch.cuda.synchronize()
            seconds[index].append(time.perf_counter() - started)
            tokens[index].add(tuple(g.output_ids for g in generations[index]))
    return [
        Timed(seconds=tuple(s), generations=tuple(g), repeatable=len(t) == 1)
        for s, g, t in zip(seconds, generations, tokens, strict=True)
    ]


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def fmt(values: tuple[float, ...]) -> str:
    return " ".join(f"{v:.3g}" for v in values)


def build_model(preset: str, seed: int) -> tuple[Any, Any, set[int], str]:
    """A seeded random Llama of ``preset`` and a word-level tokenizer of the same size."""
    shape = PRESETS[preset]
    config = transformers.LlamaConfig(
        **shape,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=PAD,
        eos_token_id=EOT,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    words = {"<pad>": PAD, "<eot>": EOT} | {f"w{i}": i for i in range(2, shape["vocab_size"])}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(words, unk_token="<pad>")),
        pad_token="<pad>",
        eos_token="<eot>",
    )
    return model, tokenizer, {EOT}, f"preset {preset} (random, seed {seed})"


def load_model(directory: Path) -> tuple[Any, Any, set[int], str]:
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    eos_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    return model, tokenizer, eos_ids, str(directory)


def make_prompts(
    count: int, shortest: int, longest: int, vocab: int, eos_ids: set[int], seed: int
) -> list[list[int]]:
    """Seeded random prompts: lengths uniform in [shortest, longest], no end-of-turn ids."""
    rng = random.Random(seed)
    usable = [t for t in range(2, vocab) if t not in eos_ids]
    return [
        [rng.choice(usable) for _ in range(rng.randint(shortest, longest))] for _ in range(count)
    ]


if __name__ == "__main__":
    main()
