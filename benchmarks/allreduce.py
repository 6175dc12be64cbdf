"""All-reduce bandwidth between the GPUs of one host, through PyTorch and NCCL.

Reduces one FP32 tensor of --elements (default: smollm2-1.7b's 1,711,376,384 parameters, the
gradient bytes DDP all-reduces per update) as a whole, then as pieces of 25 MB (DDP's default
bucket) and 200 MB, one call per piece. Prints the median time of each and the algorithm
bandwidth (bytes / time). One process per GPU, through PyTorch's launcher::

    python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/allreduce.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=1_711_376_384)
    parser.add_argument("--repeats", type=int, default=5, help="timed repeats of the whole")
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    try:
        x = torch.ones(args.elements, device="cuda")
        results = [("one tensor", _timed(lambda: dist.all_reduce(x), args.repeats))]
        for mb in (25, 200):
            results.append((f"{mb} MB pieces", _timed(_pieces(x, mb), max(1, args.repeats // 2))))
        if dist.get_rank() == 0:
            gb = args.elements * 4 / 1e9
            for name, seconds in results:
                print(f"all-reduce {gb:.2f} GB FP32 over {dist.get_world_size()} GPUs, {name}: "
                      f"{seconds * 1000:.1f} ms median, algbw {gb / seconds:.0f} GB/s")
    finally:
        dist.destroy_process_group()


def _pieces(x: torch.Tensor, mb: int) -> Callable[[], None]:
    step = mb * 1024 * 1024 // 4

    def reduce_all() -> None:
        for start in range(0, x.numel(), step):
            dist.all_reduce(x[start : start + step])

    return reduce_all


def _timed(work: Callable[[], object], repeats: int) -> float:
    work()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        torch.cuda.synchronize()
        started = time.perf_counter()
        work()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


if __name__ == "__main__":
    main()
