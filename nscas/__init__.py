"""nscas: a reproducibility-first, content-addressed artifact store for ML experiments.

The public API is loaded lazily so that importing a subpackage (``nscas.verifiers``,
``nscas.cli``) does not pull SQLAlchemy or the store.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Digest": "nscas.objects.digests",
    "NscasError": "nscas.errors",
    "Store": "nscas.store.writer",
    "StoreReader": "nscas.store.reading",
    "open_store": "nscas.store.opening",
    "init_store": "nscas.store.writer",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nscas' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
