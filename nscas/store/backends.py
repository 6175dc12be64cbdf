"""Where a store keeps its leaves' bytes, as its config says: its own ``data/``, a shared
directory, or an S3 prefix (nscas.store.s3, which imports boto3 only when it first calls it).

Apart from nscas.store.config, which the S3 backend's settings come from: the arrows point
config <- s3 <- backends, with no circle between them."""

from __future__ import annotations

from pathlib import Path

from nscas.objects.chunks import ChunkBackend, ChunkFiles
from nscas.store.config import StoreConfig
from nscas.store.s3 import S3Chunks


def chunk_backend(root: Path, config: StoreConfig | None) -> ChunkBackend:
    """The chunk backend of the store at ``root`` with ``config`` (None: an SQLite store)."""
    if config is None:
        return ChunkFiles(root)
    if config.objects.startswith("s3://"):
        return S3Chunks(config.objects, config.s3)
    return ChunkFiles(Path(config.objects))
