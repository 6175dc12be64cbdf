"""Large files stream in bounded memory (docs/format.md §5): peak RSS of a put stays far below the file."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import blake3

from nscas.store.writer import Store
from nscas.upkeep.fsck import fsck

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30
LIMIT = 300 << 20


def sparse_safetensors(path: Path, *, tensors: int, tensor_bytes: int) -> None:
    """A sparse safetensors file: F32 tensors of zeros with a few random bytes in each.

    Every tensor differs (so each is written) and is larger than the split size, so this is the
    put's worst case for memory: 32 MiB pieces, each compressed.
    """
    header = {f"t{i:02d}": {"dtype": "F32", "shape": [tensor_bytes // 4],
                            "data_offsets": [i * tensor_bytes, (i + 1) * tensor_bytes]}
              for i in range(tensors)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    base = 8 + len(raw)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(base + tensors * tensor_bytes)
        for i in range(tensors):
            for where in (100, tensor_bytes // 2 + 7):
                f.seek(base + i * tensor_bytes + where)
                f.write(blake3.blake3(b"%d-%d" % (i, where)).digest())


def test_one_gib_put_keeps_peak_rss_bounded(store: Store, tmp_path: Path) -> None:
    # The worker reports VmHWM: its ru_maxrss would include this (large) pytest process's RSS,
    # which a child inherits across fork and execve on Linux.
    path = tmp_path / "sparse.safetensors"
    sparse_safetensors(path, tensors=16, tensor_bytes=GiB // 16)
    assert path.stat().st_size > GiB
    out = subprocess.run([sys.executable, "-m", "tests.store.workers", "peak-rss", str(store.root),
                          str(path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["after"] < LIMIT, f"peak RSS {result['after'] >> 20} MiB for a 1 GiB file"
    assert result["id"] == "blake3:" + blake3.blake3().update_mmap(path).hexdigest()
    report = fsck(store, deep=False)
    assert report.errors == ()
    assert report.objects == 1 + 1 + 16 * 3  # file, header, per tensor: itself and two pieces
