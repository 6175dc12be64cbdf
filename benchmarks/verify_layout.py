"""What the bundle layout checks cost: ``verify --strict`` of a bundle in-process, median of N
runs after a warm-up, and the share of ``bundle.layout`` and ``bundle.filesystem`` in it.

    python benchmarks/verify_layout.py BUNDLE [N] [--before DIR]

``--before DIR``: also time an older verifier, a copy of its ``verifiers/`` folder saved as
``DIR/verifiers_base`` (``git archive <commit> verifiers``, renamed), side by side.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any


def _timed(fn: Callable[..., Any], target: str) -> tuple[float, Any]:
    start = time.perf_counter()
    report = fn(target, strict=True)
    return time.perf_counter() - start, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("runs", nargs="?", type=int, default=9)
    parser.add_argument("--before", default=None)
    args = parser.parse_args()
    from nscas.verifiers import verify as after
    from nscas.verifiers.bundle import layoutcheck

    spent = [0.0]
    layout = layoutcheck.layout_checks

    def measured(*a: Any, **k: Any) -> Any:
        start = time.perf_counter()
        try:
            return layout(*a, **k)
        finally:
            spent[0] += time.perf_counter() - start

    after.layout_checks = measured  # type: ignore[assignment]
    before: Any = None
    if args.before:
        sys.path.insert(0, args.before)
        before = importlib.import_module("verifiers_base.verify")
        _timed(before.verify, args.bundle)
    _timed(after.verify, args.bundle)
    times, shares, old = [], [], []
    for _ in range(args.runs):
        if before is not None:
            old.append(_timed(before.verify, args.bundle)[0])
        spent[0] = 0.0
        seconds, report = _timed(after.verify, args.bundle)
        times.append(seconds)
        shares.append(spent[0])
    total, part = statistics.median(times), statistics.median(shares)
    line = (f"verify --strict {total:.3f} s (ok={report.ok}), layout checks {part * 1000:.1f} ms"
            f" = {100 * part / total:.1f}%, median of {args.runs}")
    if old:
        line += f"; before {statistics.median(old):.3f} s"
    print(line)


if __name__ == "__main__":
    main()
