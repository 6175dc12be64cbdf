"""Writes the chunk codec vectors of docs/format.md §5.5.1: ``manifest.json`` and the stored
chunk files in ``chunks/``, from the spec's text alone (numpy, zstandard and blake3; no nscas
or verifier code), so that both sides are tested against bytes neither of them wrote.

Run ``python tests/vectors/codecs/make_vectors.py`` to write them again. The plain bytes come
from a fixed seed, so IDs and expectations never change; another zstd version may compress to
other bytes, which decode the same.

Each case is one row of the objects table (storage ``file``) and its chunk file. A case is read
in a store holding its row and the rows it names as bases, transitively, and nothing else.
``expect`` is ``ok`` (the reader gives bytes whose BLAKE3 is ``id``) or the class of refusal
the spec's checks give, one check failing per case.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import zstandard

HERE = Path(__file__).resolve().parent
CHUNKS = HERE / "chunks"
D = 8
"""The deepest chain of deltas (§5.5.1)."""
HEADER = 32


def planes(data: bytes, width: int) -> bytes:
    """The plane stream of ``data`` for ``width`` (§5.5.1): byte k of every value together,
    planes in order, then the n mod W tail bytes."""
    q = len(data) // width
    body = np.frombuffer(data, np.uint8, count=q * width).reshape(q, width).T.tobytes()
    return body + data[q * width:]


def xor(a: bytes, b: bytes) -> bytes:
    assert len(a) == len(b)
    return (np.frombuffer(a, np.uint8) ^ np.frombuffer(b, np.uint8)).tobytes()


def differences(plain: bytes, base: bytes, width: int) -> bytes:
    """The ``subW`` residual (§5.5.1): each W-byte little-endian value's difference from the
    base's mod 2^8W, as a signed integer s, stored as 2s (s >= 0) or -2s - 1 (s < 0); the
    n mod W tail bytes XOR the base's. Written out in Python integers, value by value."""
    assert len(plain) == len(base)
    q, bits = len(plain) // width, 8 * width
    out = bytearray()
    for i in range(q):
        c = int.from_bytes(plain[i * width:(i + 1) * width], "little")
        b = int.from_bytes(base[i * width:(i + 1) * width], "little")
        d = (c - b) % (1 << bits)
        s = d - (1 << bits) if d >= 1 << (bits - 1) else d
        out += (2 * s if s >= 0 else -2 * s - 1).to_bytes(width, "little")
    return bytes(out) + xor(plain[q * width:], base[q * width:])


def frame(data: bytes, level: int = 3) -> bytes:
    return zstandard.ZstdCompressor(level=level).compress(data)


def frames(data: bytes, cuts: list[int], levels: list[int]) -> bytes:
    """``data`` cut at ``cuts`` into len(cuts) + 1 frames, each at its own level."""
    edges = [0, *cuts, len(data)]
    return b"".join(frame(data[a:b], level) for a, b, level in zip(edges[:-1], edges[1:], levels,
                                                                      strict=True))


def per_plane(data: bytes, width: int, levels: list[int]) -> bytes:
    """The plane stream of ``data``, one frame per plane (the tail in the last plane's)."""
    q = len(data) // width
    return frames(planes(data, width), [q * k for k in range(1, width)], levels)


def coarse(values: np.ndarray) -> bytes:
    """FP32 values with their 16 low mantissa bits cleared (BF16 values), as bytes (so the vectors stay
    small: the low byte planes compress to almost nothing)."""
    return (values.astype("<f4").view("<u4") & np.uint32(0xFFFF0000)).tobytes()


def weights(seed: int, size: int) -> bytes:
    """``size`` bytes of little-endian FP32 values (a tensor's bytes), the last value cut."""
    rng = np.random.default_rng(seed)
    return coarse(rng.standard_normal(size // 4 + 1) * 0.02)[:size]


def tuned(base: bytes, seed: int) -> bytes:
    """The bytes of a small update of the FP32 values ``base`` (a fine-tune's tensor)."""
    rng = np.random.default_rng(seed)
    whole = len(base) // 4 * 4
    values = np.frombuffer(base, "<f4", count=whole // 4)
    step = rng.standard_normal(values.size) * 1e-4
    tail = bytes((b + 1) % 256 for b in base[whole:])
    return coarse(values + step) + tail


def bid(data: bytes) -> str:
    return "blake3:" + blake3.blake3(data).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    name: str
    codec: str
    plain: bytes
    """The bytes the row's ID and SHA-256 are of."""
    stored: bytes
    expect: str
    about: str
    base: str | None = None
    """The case whose ID the row's ``base`` column holds."""
    base_id: str | None = None
    """The row's ``base`` column where it names no case."""
    size: int | None = None
    """The row's recorded size, where it is not len(plain)."""


def delta(name: str, codec: str, plain: bytes, base: Case, *, expect: str = "ok",
          about: str, header: str | None = None, residual: bytes | None = None,
          levels: list[int] | None = None) -> Case:
    """An ``xorW`` or ``subW`` case: the header (``header`` or the base's ID), then the
    residual's plane stream in zstd frames."""
    width = int(codec[3:])
    if residual is not None:
        res = residual
    elif codec.startswith("sub"):
        res = differences(plain, base.plain, width)
    else:
        res = xor(plain, base.plain)
    body = per_plane(res, width, levels) if levels else frame(planes(res, width))
    head = bytes.fromhex((header or bid(base.plain))[7:])
    return Case(name=name, codec=codec, plain=plain, stored=head + body, expect=expect,
                about=about, base=base.name)


def cases() -> list[Case]:
    n = 4099  # n mod 2, 4 and 8 all nonzero
    a, b = weights(1, n), weights(2, n)
    a8, a2, a1 = weights(3, 4104), weights(4, 4098), weights(5, 4101)
    out: list[Case] = []
    add = out.append

    # --- every codec decoding to its plain bytes
    raw = Case(name="raw", codec="raw", plain=a, stored=a, expect="ok", about="the plain bytes")
    add(raw)
    add(Case(name="zstd", codec="zstd", plain=a, stored=frame(a), expect="ok",
             about="one zstd frame, level 3"))
    add(Case(name="zstd-three-frames", codec="zstd", plain=b,
             stored=frames(b, [1, 2000], [1, 19, -5]), expect="ok",
             about="three frames cut anywhere (1 byte, 1999 bytes, the rest), levels 1, 19, -5"))
    p2 = Case(name="planes2", codec="planes2", plain=a, stored=frame(planes(a, 2)), expect="ok",
              about="byte planes of width 2, n mod 2 = 1")
    p4 = Case(name="planes4", codec="planes4", plain=a,
              stored=per_plane(a, 4, [1, 3, 9, 19]), expect="ok",
              about="byte planes of width 4, one frame per plane at levels 1, 3, 9, 19, the "
                    "3 tail bytes in the last")
    p8 = Case(name="planes8", codec="planes8", plain=a,
              stored=frames(planes(a, 8), [100, 3001], [3, 3, 1]), expect="ok",
              about="byte planes of width 8, frames cut inside planes")
    out += [p2, p4, p8]
    add(Case(name="planes4-whole", codec="planes4", plain=a8, stored=frame(planes(a8, 4)),
             expect="ok", about="byte planes of width 4, n mod 4 = 0 (no tail)"))
    p8w = Case(name="planes8-whole", codec="planes8", plain=a8, stored=frame(planes(a8, 8)),
               expect="ok", about="byte planes of width 8, n mod 8 = 0")
    add(p8w)
    add(Case(name="planes4-tail2", codec="planes4", plain=a2, stored=frame(planes(a2, 4)),
             expect="ok", about="byte planes of width 4, n mod 4 = 2"))
    add(Case(name="planes2-tail1", codec="planes2", plain=a1, stored=frame(planes(a1, 2)),
             expect="ok", about="byte planes of width 2, n mod 2 = 1, n mod 4 = 1"))
    child = tuned(a, 10)
    add(delta("xor1", "xor1", child, raw, about="XOR with a raw base, width 1 (no planes)"))
    add(delta("xor2", "xor2", child, p2, about="XOR with a planes2 base, width 2"))
    x4 = delta("xor4", "xor4", child, p4, levels=[19, 19, 3, 1],
               about="XOR with a planes4 base, width 4, one frame per plane")
    add(x4)
    child8 = tuned(a8, 11)
    add(delta("xor8", "xor8", child8, p8w, about="XOR with a planes8 base, width 8, n mod 8 = 0"))
    zbase = out[1]
    add(delta("xor8-tail", "xor8", child, zbase, about="XOR with a zstd base, width 8, "
                                                         "n mod 8 = 3"))
    add(delta("sub2", "sub2", child, p2, about="differences to a planes2 base, width 2, "
                                               "n mod 2 = 1"))
    sub4 = delta("sub4", "sub4", child, p4, levels=[19, 3, 1, 9],
                 about="differences to a planes4 base, width 4, one frame per plane, the 3 "
                       "tail bytes XORed")
    add(sub4)
    add(delta("sub8", "sub8", child8, p8w, about="differences to a planes8 base, width 8, "
                                                 "n mod 8 = 0"))
    add(delta("sub4-raw-base", "sub4", child, raw, about="differences to a raw base"))
    # Values whose differences wrap: 0 - 1, 2^32 - 1 - 0, 2^31 apart (the most negative s).
    edge = np.array([0, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 5, 3] * 200, "<u4").tobytes()
    edge_base = np.array([1, 0, 0, 0xFFFFFFFF, 3, 5] * 200, "<u4").tobytes()
    eb = Case(name="sub4-wrap-base", codec="raw", plain=edge_base, stored=edge_base,
              expect="ok", about="the base of sub4-wrap")
    add(eb)
    add(delta("sub4-wrap", "sub4", edge, eb, about="differences that wrap mod 2^32, the most "
                                                     "negative one -2^31 among them"))
    sub_over_xor = delta("sub4-over-xor", "sub4", tuned(child, 12), x4,
                         about="differences to an xor4 base (xor4 above)")
    add(sub_over_xor)
    add(delta("xor4-over-sub", "xor4", tuned(tuned(child, 12), 13), sub_over_xor,
              about="XOR with a sub4 base (its plane stream is its residual's, not its "
                    "plain bytes')"))

    # --- a chain of exactly D deltas is read; D + 1 is refused
    top = Case(name="chain-0", codec="planes4", plain=b, stored=frame(planes(b, 4)),
               expect="ok", about="the non-delta end of a chain")
    add(top)
    widths = ["xor4", "sub4", "xor1", "sub2", "xor8", "sub8", "xor2", "sub4", "xor4"]
    for depth, codec in enumerate(widths, start=1):
        plain = tuned(top.plain, 100 + depth)
        too_deep = depth > D
        top = delta(f"chain-{depth}", codec, plain, top,
                    expect="chain-too-deep" if too_deep else "ok",
                    about=f"a chain of {depth} deltas" + (f", more than D = {D}" if too_deep
                                                         else ""))
        add(top)

    # --- the row checks, each failing alone
    zstd_of_a = frame(a)
    add(Case(name="unknown-planes1", codec="planes1", plain=a, stored=frame(a),
             expect="unknown-codec", about="no planes1 codec (W = 1 is only for xor)"))
    add(Case(name="unknown-xor16", codec="xor16", plain=child,
             stored=bytes.fromhex(bid(a)[7:]) + frame(planes(xor(child, a), 16)),
             expect="unknown-codec", base="raw", about="no width 16"))
    add(Case(name="unknown-sub1", codec="sub1", plain=child,
             stored=bytes.fromhex(bid(a)[7:]) + frame(differences(child, a, 1)),
             expect="unknown-codec", base="raw", about="no sub1 (sub is for W = 2, 4, 8)"))
    add(Case(name="unknown-case", codec="ZSTD", plain=a, stored=zstd_of_a,
             expect="unknown-codec", about="codec names are lowercase"))
    add(Case(name="no-header", codec="xor4", plain=child, stored=bytes.fromhex(bid(a)[7:])[:20],
             expect="no-header", base="raw", about="a delta's file shorter than its 32-byte "
                                                   "header"))
    add(delta("header-not-row", "xor4", child, raw, header=bid(b), expect="base-mismatch",
              about="the header names another leaf than the row's base column"))
    add(delta("sub-header-not-row", "sub4", child, raw, header=bid(b), expect="base-mismatch",
              about="a sub4 delta whose header names another leaf than its row's base"))
    add(Case(name="sub-no-header", codec="sub2", plain=child,
             stored=bytes.fromhex(bid(a)[7:])[:31], expect="no-header", base="raw",
             about="a sub2 delta's file one byte short of its header"))
    add(Case(name="row-base-null", codec="xor4", plain=child,
             stored=bytes.fromhex(bid(a)[7:]) + frame(planes(xor(child, a), 4)),
             expect="base-mismatch", about="a delta whose row has no base"))
    add(Case(name="base-on-zstd", codec="zstd", plain=a, stored=zstd_of_a,
             base="zstd-three-frames",
             expect="base-mismatch", about="a non-delta row whose base column is not NULL"))
    ghost = bid(b"no such leaf")
    add(Case(name="missing-base", codec="xor4", plain=child,
             stored=bytes.fromhex(ghost[7:]) + frame(planes(xor(child, a), 4)),
             base_id=ghost, expect="missing-base", about="the base has no row in the store"))
    add(delta("base-size", "xor4", a8[:n], p8w, header=bid(p8w.plain), expect="base-size",
              residual=xor(a8[:n], a[:n]), about="the base records 4104 bytes, the delta 4099"))
    # A cycle: two deltas naming each other, and one naming itself.
    ca, cb = tuned(a, 20), tuned(a, 21)
    res = xor(ca, cb)
    add(Case(name="cycle-a", codec="xor4", plain=ca,
             stored=bytes.fromhex(bid(cb)[7:]) + frame(planes(res, 4)), base="cycle-b",
             expect="cycle", about="a delta whose base's base is itself"))
    add(Case(name="cycle-b", codec="xor4", plain=cb,
             stored=bytes.fromhex(bid(ca)[7:]) + frame(planes(res, 4)), base="cycle-a",
             expect="cycle", about="the other half of the cycle"))
    add(Case(name="cycle-self", codec="xor1", plain=ca,
             stored=bytes.fromhex(bid(ca)[7:]) + frame(bytes(n)), base="cycle-self",
             expect="cycle", about="a delta that is its own base"))
    # A delta whose base's row is wrong: the chain check finds it before decoding anything.
    broken = delta("bad-link", "xor4", child, raw, header=bid(b), expect="base-mismatch",
                   about="a delta in the middle of a chain whose header names another leaf")
    add(broken)
    add(delta("over-bad-link", "xor2", tuned(child, 30), broken, expect="base-mismatch",
              about="a delta whose base is the bad link above"))

    # --- decoding, bounded
    add(Case(name="raw-bomb", codec="raw", plain=a, stored=a + b"\0", size=n, expect="bomb",
             about="a raw file one byte longer than its record"))
    add(Case(name="zstd-bomb", codec="zstd", plain=a, stored=frame(a + b"\0"), expect="bomb",
             about="zstd decoding to one byte more than the record"))
    cobj = zstandard.ZstdCompressor(level=19).compressobj()
    big = b"".join(cobj.compress(bytes(1 << 16)) for _ in range(16)) + cobj.flush()
    add(Case(name="zstd-bomb-1mib", codec="zstd", plain=a, stored=frame(a) + big, expect="bomb",
             about="a second frame of 1 MiB of zeros after the plain bytes (no content size)"))
    add(Case(name="planes4-bomb", codec="planes4", plain=a,
             stored=frame(planes(a, 4) + b"\0" * 4), expect="bomb",
             about="a plane stream 4 bytes longer than the record"))
    add(delta("xor2-bomb", "xor2", child, p2, residual=xor(child, a) + b"\0", expect="bomb",
              about="a residual plane stream one byte longer than the record"))
    add(delta("sub4-bomb", "sub4", child, p4, residual=differences(child, a, 4) + b"\0" * 4,
              expect="bomb", about="a difference plane stream 4 bytes longer than the record"))
    add(delta("sub8-short", "sub8", child, zbase,
              residual=differences(child, a, 8)[:-1], expect="short",
              about="a difference plane stream one byte shorter than the record"))
    add(Case(name="planes4-short", codec="planes4", plain=a, stored=frame(planes(a, 4)[:-1]),
             expect="short", about="a plane stream one byte shorter than the record"))
    add(Case(name="planes8-short", codec="planes8", plain=a,
             stored=frame(planes(a, 8)[:n // 2]), expect="short",
             about="a plane stream half the record"))
    add(delta("xor4-short", "xor4", child, p4, residual=xor(child, a)[:-3], expect="short",
              about="a residual plane stream 3 bytes short"))
    add(Case(name="zstd-short", codec="zstd", plain=a, stored=frame(a[:-1]), expect="short",
             about="zstd decoding to one byte less than the record"))
    add(Case(name="planes-width-forged", codec="planes4", plain=a, stored=frame(planes(a, 2)),
             expect="wrong-bytes", about="a planes2 stream recorded as planes4"))
    add(Case(name="xor-width-forged", codec="xor4", plain=child, base="planes2",
             stored=bytes.fromhex(bid(a)[7:]) + frame(planes(xor(child, a), 2)),
             expect="wrong-bytes", about="an xor2 residual stream recorded as xor4"))
    add(Case(name="sub-width-forged", codec="sub4", plain=child, base="planes2",
             stored=bytes.fromhex(bid(a)[7:]) + frame(planes(differences(child, a, 2), 2)),
             expect="wrong-bytes", about="a sub2 residual stream recorded as sub4"))
    add(Case(name="sub-as-xor", codec="xor4", plain=child, base="planes4",
             stored=bytes.fromhex(bid(a)[7:]) + frame(planes(differences(child, a, 4), 4)),
             expect="wrong-bytes", about="a sub4 residual stream recorded as xor4"))
    other = tuned(a, 40)
    add(delta("sub-other-bytes", "sub4", child, p4, residual=differences(other, a, 4),
              expect="wrong-bytes", about="a well-formed sub4 delta that decodes to other "
                                          "bytes than its ID"))
    add(delta("xor-other-bytes", "xor4", child, p4, residual=xor(other, a), expect="wrong-bytes",
              about="a well-formed delta that decodes to other bytes than its ID"))
    flipped = bytearray(a)
    flipped[1000] ^= 0x40
    bad_base = Case(name="base-other-bytes", codec="raw", plain=a, stored=bytes(flipped),
                    expect="wrong-bytes", about="a raw leaf with a flipped bit")
    add(bad_base)
    add(delta("over-other-bytes", "xor4", child, bad_base, expect="wrong-bytes",
              about="a delta whose base decodes to other bytes than the base's ID"))
    add(delta("sub-over-other-bytes", "sub4", child, bad_base, expect="wrong-bytes",
              about="a sub4 delta whose base decodes to other bytes than the base's ID"))
    limit = n + n // 128 + (64 << 10)
    empty = frame(b"")
    pad = empty * ((limit + HEADER + 1024 - len(zstd_of_a)) // len(empty) + 1)
    add(Case(name="stored-too-large", codec="zstd", plain=a, stored=zstd_of_a + pad,
             expect="stored-too-large", about="valid frames (the plain bytes, then empty "
                                              "frames) more than size + size/128 + 64 KiB + "
                                              "1 KiB"))
    params = zstandard.ZstdCompressionParameters(window_log=26, enable_ldm=True)
    wobj = zstandard.ZstdCompressor(compression_params=params).compressobj()
    add(Case(name="window-too-large", codec="zstd", plain=a, stored=wobj.compress(a) +
             wobj.flush(), expect="window-too-large", about="a frame asking for a 64 MiB "
                                                             "window"))
    add(Case(name="not-zstd", codec="planes2", plain=a, stored=planes(a, 2), expect="corrupt",
             about="a plane stream not in zstd frames"))
    return out


def world(case: Case, by_name: dict[str, Case]) -> list[Case]:
    """The case and the cases it names as bases, transitively (each once)."""
    found = [case]
    while found[-1].base is not None and by_name[found[-1].base] not in found:
        found.append(by_name[found[-1].base])
    return found


def row(case: Case, by_name: dict[str, Case]) -> dict[str, Any]:
    base_id = bid(by_name[case.base].plain) if case.base is not None else case.base_id
    return {"name": case.name, "codec": case.codec,
            "size": len(case.plain) if case.size is None else case.size,
            "id": bid(case.plain), "sha256": hashlib.sha256(case.plain).hexdigest(),
            "base": case.base, "base_id": base_id, "file": f"chunks/{case.name}.bin",
            "stored_size": len(case.stored), "expect": case.expect, "about": case.about}


ABOUT = ("Chunk codecs (docs/format.md §5.5.1): each case is a row of the objects table "
         "(storage 'file') and its chunk file. Read a case in a store that holds its row and, "
         "transitively, the rows of the cases named by 'base', and nothing else. 'base_id' is the "
         "row's base column (NULL: null), 'base' the case it names, if any. 'expect' is 'ok' (the "
         "bytes read have BLAKE3 'id' and SHA-256 'sha256') or the refusal: unknown-codec, "
         "no-header, base-mismatch (header, row, or a base on a non-delta), missing-base, "
         "base-size, chain-too-deep, cycle, bomb (decodes past size), short (decodes to fewer), "
         "wrong-bytes (decodes, BLAKE3 is not the ID: of the leaf or of a base), "
         "stored-too-large, window-too-large (a zstd window over 32 MiB), corrupt (not zstd). "
         "A refusal is of the case read (the first row), whichever link of its chain is bad.")


def main() -> None:
    all_cases = cases()
    by_name = {c.name: c for c in all_cases}
    assert len(by_name) == len(all_cases)
    for case in all_cases:  # a case's store holds each ID once
        ids = [bid(c.plain) for c in world(case, by_name)]
        assert len(set(ids)) == len(ids), case.name
    CHUNKS.mkdir(exist_ok=True)
    for old in CHUNKS.glob("*.bin"):
        old.unlink()
    for case in all_cases:
        (CHUNKS / f"{case.name}.bin").write_bytes(case.stored)
    manifest = {"about": ABOUT, "depth": D, "cases": [row(c, by_name) for c in all_cases]}
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False)
                                        + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
