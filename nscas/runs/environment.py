"""The ``environment/1`` record of the process that runs a step (docs/format.md §6.7)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

_ENV_PACKAGES = ("nscas", "torch", "transformers", "tokenizers", "safetensors", "numpy", "scipy",
                 "blake3", "rfc8785", "zstandard", "SQLAlchemy", "alembic", "aiohttp", "httpx")


def environment() -> dict[str, Any]:
    """Where this process runs. torch details only if a recipe imported it (never imported here)."""
    packages = {}
    for name in _ENV_PACKAGES:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    torch = sys.modules.get("torch")
    torch_info: dict[str, Any] | None = None
    devices: list[dict[str, Any]] = [{"type": "cpu", "name": platform.processor() or platform.machine(),
                                      "count": os.cpu_count() or 1}]
    determinism: dict[str, Any] = {"PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED"),
                                   "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}
    if torch is not None:
        import hashlib

        config = torch.__config__.show()
        torch_info = {"version": torch.__version__, "cuda": torch.version.cuda,
                      "debug": bool(torch.version.debug),
                      "config_sha256": hashlib.sha256(config.encode()).hexdigest(),
                      "threads": torch.get_num_threads()}
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devices.append({"type": "cuda", "index": i, "name": p.name,
                                "memory_bytes": int(p.total_memory), "capability": f"{p.major}.{p.minor}"})
        determinism.update({
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
            "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
            "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
            "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        })
    return {"nscas": "environment/1", "python": sys.version.split()[0],
            "platform": platform.platform(), "host": platform.node(), "packages": packages,
            "torch": torch_info, "devices": devices, "determinism": determinism}
