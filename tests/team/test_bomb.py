"""A chunk replaced by a zstd bomb (a small frame that decodes to gigabytes), in S3 behind a
team store or in a local store's data/: ``get``, ``fsck --deep`` and ``pull`` fail with one line
naming the chunk, and their memory stays bounded by the chunk's recorded size, never by what
the frame decodes to. Peak RSS is each real ``nscas`` process's own (``os.wait4``)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zstandard

from nscas.objects.digests import Digest
from nscas.store.s3 import S3Chunks, client
from nscas.store.writer import init_store
from tests.store.services import TeamServices

BOMB_PLAIN = 1 << 30  # what the bomb decodes to: far above any leaf
LEAF = 8 << 20  # the honest leaf's plain size: its chunk is replaced


@dataclass(frozen=True, slots=True, kw_only=True)
class Peak:
    code: int
    err: str  # stderr and stdout
    rss: int  # bytes


# Linux keeps a process's peak RSS across exec, so a child forked from pytest reports pytest's
# peak: a small launcher forks the real command and reports that grandchild's own (os.wait4).
_LAUNCH = ("import os, subprocess, sys\n"
           "p = subprocess.Popen(sys.argv[2:])\n"
           "_, status, usage = os.wait4(p.pid, 0)\n"
           "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
           "sys.exit(os.waitstatus_to_exitcode(status))\n")


def _run(*args: str, store: Path, tmp: Path) -> Peak:
    """``nscas ARGS`` as a real process, with its own peak resident set size."""
    env = {**os.environ, "NSCAS_STORE": str(store)}
    peak = tmp / "peak"
    p = subprocess.run([sys.executable, "-c", _LAUNCH, str(peak), sys.executable, "-m",
                        "nscas.cli", *args], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    return Peak(code=p.returncode, err=p.stdout, rss=int(peak.read_text()) * 1024)


def bomb(*, declared: bool) -> bytes:
    """A zstd frame of a few hundred KiB that decodes to :data:`BOMB_PLAIN` zero bytes; with
    ``declared``, the frame header states that content size, otherwise it states none."""
    cobj = zstandard.ZstdCompressor(level=19).compressobj(size=BOMB_PLAIN if declared else -1)
    block = bytes(1 << 20)
    out = b"".join(cobj.compress(block) for _ in range(BOMB_PLAIN >> 20))
    return out + cobj.flush()


def _leaf() -> bytes:
    rng = np.random.default_rng(7)
    return rng.integers(0, 16, LEAF, dtype=np.uint8).tobytes()  # compresses: stored as zstd


def _check(ran: Peak, honest: Peak, oid: Digest) -> None:
    lines = ran.err.strip().splitlines()
    assert ran.code in (1, 2) and len(lines) <= 3, ran.err
    assert oid.hex in ran.err and "at most" in ran.err and "Traceback" not in ran.err, ran.err
    # One chunk's worth above the honest run's peak: the leaf, a copy, a zstd window.
    assert ran.rss - honest.rss < 3 * LEAF + (32 << 20), (ran.rss, honest.rss)


@pytest.mark.parametrize("declared", [False, True])
def test_bomb_in_s3_fails_get_fsck_pull_in_bounded_memory(
        team_services: TeamServices, tmp_path: Path, declared: bool) -> None:
    store = init_store(tmp_path / "team", team_services.config())
    oid = store.put_bytes(_leaf())
    assert store.info(oid).codec == "zstd"
    store.ref_set("leaf", oid)
    config = store.config
    store.close()
    assert config is not None and config.s3 is not None
    toml = tmp_path / "team" / ".nscas" / "store.toml"
    local = tmp_path / "laptop"
    init_store(local).close()
    remote = subprocess.run([sys.executable, "-m", "nscas.cli", "remote", "add", "team", str(toml)],
                            env={**os.environ, "NSCAS_STORE": str(local / ".nscas")},
                            capture_output=True, text=True)
    assert remote.returncode == 0, remote.stderr

    def commands(n: int) -> list[tuple[Path, tuple[str, ...]]]:
        return [(toml, ("get", "leaf", str(tmp_path / f"out{n}"))), (toml, ("fsck", "--deep")),
                (local / ".nscas", ("pull", "leaf", "--from", "team"))]

    honest = [_run(*args, store=s, tmp=tmp_path) for s, args in commands(0)]
    assert [h.code for h in honest] == [0, 0, 0], [h.err for h in honest]
    chunks = S3Chunks(config.objects, config.s3)
    body = bomb(declared=declared)
    assert len(body) < LEAF
    client(config.s3).put_object(Bucket=chunks.bucket, Key=chunks.key(oid), Body=body)
    local_again = tmp_path / "laptop2"  # a pull into a store that lacks the leaf
    init_store(local_again).close()
    (local_again / ".nscas" / "remotes.toml").write_bytes(
        (local / ".nscas" / "remotes.toml").read_bytes())
    cmds = commands(1)
    cmds[2] = (local_again / ".nscas", cmds[2][1])
    for (where, args), ok in zip(cmds, honest, strict=True):
        ran = _run(*args, store=where, tmp=tmp_path)
        print(f"{args[0]}: honest {ok.rss >> 20} MiB, bomb {ran.rss >> 20} MiB")
        _check(ran, ok, oid)
    assert not (tmp_path / "out1").exists()


def test_bomb_in_a_local_chunk_file_fails_in_bounded_memory(tmp_path: Path) -> None:
    store = init_store(tmp_path)
    oid = store.put_bytes(_leaf())
    store.ref_set("leaf", oid)
    chunk = store.chunks.path(oid)  # type: ignore[attr-defined]
    store.close()
    where = tmp_path / ".nscas"
    honest = _run("get", "leaf", str(tmp_path / "out0"), store=where, tmp=tmp_path)
    assert honest.code == 0, honest.err
    chunk.chmod(0o644)
    chunk.write_bytes(bomb(declared=False))
    for args in (("get", "leaf", str(tmp_path / "out1")), ("fsck", "--deep"),
                 ("export", "leaf", str(tmp_path / "bundle"))):
        ran = _run(*args, store=where, tmp=tmp_path)
        _check(ran, honest, oid)
