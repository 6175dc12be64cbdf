"""``nscas import-gguf`` holds the dequantised weights in memory once: its peak RSS grows with
the model by about one FP32 copy of it, not two or three (a 1.8B model is 7.1 GB in FP32, and
the machine that converts it may have little more; issue 42). Measured on real processes, a
tiny qwen2 GGUF against one 130 MB larger in FP32."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nscas import init_store
from tests.recipes.test_gguf_qwen2_fixtures import qwen2_parameters, write_qwen2_gguf

LARGER = {"layers": 2, "hidden": 1024, "ffn": 4096}
ONE_COPY_AND_SLACK = 1.6
"""Peak RSS growth allowed, in FP32 copies of the added weights: one copy, plus what the GGUF
file's mapped pages and a tensor in flight take. Two copies (a second model to save from, or
the saved model loaded beside the converted one) fail."""


def peak_rss_of_import(tmp: Path, gguf: Path) -> int:
    """The peak RSS in bytes of one ``nscas import-gguf`` process on a fresh store."""
    store = init_store(tmp / f"store-{gguf.stem}")
    store.close()
    command = [sys.executable, "-m", "nscas.cli", "--store", str(store.root), "import-gguf",
               str(gguf)]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    errors = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, errors.decode()
    return usage.ru_maxrss * 1024  # kilobytes on Linux


def test_peak_memory_grows_by_one_copy_of_the_weights(tmp_path: Path) -> None:
    tiny = write_qwen2_gguf(tmp_path / "tiny.gguf")
    larger = write_qwen2_gguf(tmp_path / "larger.gguf", **LARGER)
    added = (qwen2_parameters(**LARGER) - qwen2_parameters()) * 4
    growth = peak_rss_of_import(tmp_path, larger) - peak_rss_of_import(tmp_path, tiny)
    assert growth < ONE_COPY_AND_SLACK * added, (
        f"peak RSS grew by {growth / 2**20:.0f} MiB for {added / 2**20:.0f} MiB of FP32 weights")
