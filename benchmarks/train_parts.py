"""Where an update's time goes: nscas's passes, clipping and AdamW step, each timed alone.

One process, one device. The model of --preset gets random weights directly on the device
(timing only: no seeded initialisation, no checkpoint). For every size in --docs it times one
stacked pass (``documents_loss_sums`` and its backward: what ``micro_batch`` = size does on a
rank with that many documents), then the parts of an update that do not shrink with more
ranks: ``clip_grad_norm_``, ``optimizer.step()`` (nscas's AdamW: fused on CUDA) and
``zero_grad``. From these it prints the speed-up that two ranks could reach at best if the
gradient all-reduce cost nothing: (pass(8) + fixed) / (pass(4) + fixed).

Example:
    python3 benchmarks/train_parts.py --preset smollm2-1.7b --device cuda --length 1024
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
from train import synthetic_documents  # benchmarks/train.py: the same documents

from nscas.recipes.init.presets import PRESETS, build_model, parameter_count
from nscas.recipes.train.config import TrainParams
from nscas.recipes.train.loop import configure_determinism, documents_loss_sums, make_optimizer
from nscas.recipes.train.worker import CUBLAS_WORKSPACE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama-tiny")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--length", type=int, default=256, help="tokens per document")
    parser.add_argument("--docs", type=int, nargs="+", default=[8, 4],
                        help="documents per pass to time (the first and second give the ratio)")
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of every part")
    parser.add_argument("--vocab", type=int, default=None, help="embedding rows (default 2,048)")
    parser.add_argument("--deterministic", choices=("on", "off"), default="off")
    args = parser.parse_args()
    if args.repeats < 1 or args.length < 4 or min(args.docs) < 1:
        parser.error("need --repeats >= 1, --length >= 4 and --docs >= 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible")

    if args.deterministic == "on":
        # As nscas's workers do: cuBLAS reads it when its first handle is made.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    configure_determinism(deterministic=args.deterministic == "on")
    device = torch.device(args.device)
    vocab = args.vocab or PRESETS[args.preset].vocab_size or 2048
    model = build_model(args.preset, vocab_size=vocab, seed=0, meta=True)
    model.to_empty(device=device)
    model.tie_weights()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02)
    model.train()
    params = TrainParams()
    optimizer = make_optimizer(model, params)
    docs = synthetic_documents(max(args.docs), args.length, vocab)

    passes = {}
    for size in args.docs:
        def one_pass(size: int = size) -> None:
            sums = documents_loss_sums(model, docs[:size], device=device)
            (sums * (1.0 / (size * args.length))).sum().backward()
        passes[size] = _timed(one_pass, device, args.repeats)
    clip = _timed(lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), params.clip),
                  device, args.repeats)
    step = _timed(optimizer.step, device, args.repeats)
    zero = _timed(lambda: optimizer.zero_grad(set_to_none=True), device, args.repeats)

    _tensors, scalars = parameter_count(model)
    print(f"model: {args.preset}, {scalars:,} parameters; device {args.device}; "
          f"{args.length} tokens per document; deterministic {args.deterministic}; "
          f"median of {args.repeats}")
    for size, seconds in passes.items():
        print(f"  pass of {size} documents (forward + backward)   {seconds * 1000:9.1f} ms "
              f"({seconds / size * 1000:.1f} ms per document)")
    fixed = clip + step + zero
    print(f"  clip_grad_norm_                            {clip * 1000:9.1f} ms")
    print(f"  optimizer.step()                           {step * 1000:9.1f} ms")
    print(f"  zero_grad                                  {zero * 1000:9.1f} ms")
    if len(args.docs) >= 2:
        big, small = args.docs[0], args.docs[1]
        best = (passes[big] + fixed) / (passes[small] + fixed)
        print(f"pass({big}) / pass({small}): {passes[big] / passes[small]:.3f}x; "
              f"best speed-up of {big // small if small and big % small == 0 else '?'} ranks "
              f"with a free all-reduce: {best:.3f}x")


def _timed(work: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``work`` after one untimed call, the device synchronised around it."""
    work()
    seconds = []
    for _ in range(repeats):
        _synchronise(device)
        started = time.perf_counter()
        work()
        _synchronise(device)
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
