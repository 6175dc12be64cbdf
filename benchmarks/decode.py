"""Per-token decoding time of one replica's model, without HTTP: alone, or beside a twin.

Builds the serve benchmark's model (``serve.sharpened_model``: a seeded preset scaled so
prompts get distinct answers) and its grounded dev prompts, then greedy-decodes each prompt
alone (batch 1, as a max_batch 1 replica does) and reports milliseconds per output token:
each prompt's seconds to its last token over its output length, median, min and max.

``--decoding static`` uses the ``StaticDecoder`` that FP32 CUDA replicas use (each step
replayed as a CUDA graph; on CPU it runs eagerly), ``dynamic`` the growing cache ``evaluate``
uses. ``--pair`` (CUDA) runs two copies at once, one per GPU, started together, to show
whether two decoding processes on one host slow each other down.

Examples:
    .venv/bin/python benchmarks/decode.py --device cpu --preset llama-tiny --prompts 4
    python3 benchmarks/decode.py --device cuda --preset llama-small --decoding static --pair
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serve import sharpened_model  # benchmarks/serve.py: the same model and tokenizer

from nscas.recipes.common import tasks as T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--preset", default="llama-small")
    parser.add_argument("--sharpen", type=float, default=6.0)
    parser.add_argument("--prompts", type=int, default=32, help="prompts decoded (measured)")
    parser.add_argument("--warmup", type=int, default=6, help="prompts decoded first, unmeasured")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--decoding", choices=("static", "dynamic"), default="static")
    parser.add_argument("--pair", action="store_true",
                        help="CUDA: two processes at once, on GPUs 0 and 1")
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pair:
        if args.device != "cuda":
            raise SystemExit("--pair needs --device cuda (one process per GPU)")
        pair(args)
    else:
        print(decode(args))


def decode(args: argparse.Namespace) -> str:
    """One process's line: where it ran and its milliseconds per token."""
    import torch
    from transformers import AutoTokenizer

    from nscas.recipes.common.generate import generate_greedy
    from nscas.recipes.common.static_decode import StaticDecoder
    from nscas.recipes.common.tokenise import encode_prompt

    torch.set_num_threads(1)
    dev = T.generate_role("dev", max(args.prompts, args.warmup), T.DEFAULT_SEED,
                          T.default_wordings())
    with tempfile.TemporaryDirectory(prefix="nscas-bench-decode-") as tmp:
        model, tok_dir = sharpened_model(Path(tmp), args.preset, args.sharpen, dev)
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    model = model.to(args.device).eval()
    prompts = [encode_prompt(tokenizer, t.prompt) for t in dev]
    static = StaticDecoder(model, graphs=True) if args.decoding == "static" else None

    def one(prompt: list[int]) -> float:
        [g] = generate_greedy(model, tokenizer, [prompt], max_new_tokens=args.max_new_tokens,
                              batch_size=1, eos_ids={tokenizer.eos_token_id},
                              device=args.device, precision="fp32", static=static)
        return g.seconds / len(g.output_ids) * 1e3

    for prompt in prompts[: args.warmup]:
        one(prompt)
    if args.start_at is not None:  # the pair's processes start measuring together
        time.sleep(max(0.0, args.start_at - time.time()))
    started = time.perf_counter()
    per_token = [one(prompt) for prompt in prompts[: args.prompts]]
    seconds = time.perf_counter() - started
    where = (f"GPU {os.environ.get('CUDA_VISIBLE_DEVICES', '0')}" if args.device == "cuda"
             else "CPU")
    return (f"{where}, {args.decoding}: ms per token median {statistics.median(per_token):.2f}, "
            f"min {min(per_token):.2f}, max {max(per_token):.2f}; {args.prompts} prompts "
            f"in {seconds:.2f} s")


def pair(args: argparse.Namespace) -> None:
    # Both processes build their model first; they measure from one wall-clock instant.
    start_at = time.time() + 30
    argv = [sys.executable, __file__, "--device", "cuda", "--preset", args.preset,
            "--sharpen", str(args.sharpen), "--prompts", str(args.prompts),
            "--warmup", str(args.warmup), "--max-new-tokens", str(args.max_new_tokens),
            "--decoding", args.decoding, "--start-at", str(start_at)]
    children = [subprocess.Popen(argv, env={**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)})
                for gpu in (0, 1)]
    codes = [child.wait() for child in children]
    if any(codes):
        raise SystemExit(f"a decoding process failed: exit statuses {codes}")


if __name__ == "__main__":
    main()
