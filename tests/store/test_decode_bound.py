"""Every chunk decode is bounded by the leaf's record (nscas.objects.decoding.plain_blocks): exactly the
recorded size passes, one byte more is refused naming the chunk, whatever the codec or frame."""

from __future__ import annotations

import io

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from nscas.errors import DecodeBoundExceeded, IntegrityError
from nscas.objects import codecs
from nscas.objects.decoding import (
    ZSTD_WINDOW_MAX,
    decode,
    plain_digest,
    plane_stream,
    read_capped,
    stored_max,
)
from nscas.objects.digests import Digest


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=20000), codec=st.sampled_from(["raw", "zstd"]),
       declared=st.booleans())
def test_exactly_the_recorded_size_decodes_and_one_byte_less_is_refused(
        data: bytes, codec: str, declared: bool) -> None:
    if codec == "zstd":
        cobj = zstandard.ZstdCompressor().compressobj(size=len(data) if declared else -1)
        stored = cobj.compress(data) + cobj.flush()
    else:
        stored = data
    assert decode(stored, codec, Digest("ab" * 32), len(data)) == data
    assert plain_digest(io.BytesIO(stored), codec, Digest("ab" * 32), len(data))[1] == len(data)
    assert decode(stored, codec, Digest("ab" * 32), len(data) + 5) == data  # short: the hash judges it
    if data:
        with pytest.raises(DecodeBoundExceeded, match=f"at most {len(data) - 1} bytes"):
            decode(stored, codec, Digest("ab" * 32), len(data) - 1, where="chunk file X")


def test_a_frame_asking_for_a_huge_window_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters(window_log=27, enable_ldm=True)
    big = bytes(range(256)) * (1 << 12)
    cobj = zstandard.ZstdCompressor(compression_params=params).compressobj()  # no content size
    stored = cobj.compress(big) + cobj.flush()
    assert ZSTD_WINDOW_MAX < 1 << 27
    with pytest.raises(IntegrityError, match="undecodable zstd data"):
        decode(stored, "zstd", Digest("cd" * 32), len(big))


def test_stored_bytes_past_what_the_size_allows_are_refused_unread() -> None:
    size = 1000
    padded = zstandard.ZstdCompressor().compress(b"x" * size) + bytes(stored_max(size))
    with pytest.raises(IntegrityError, match="stored bytes its size allows"):
        decode(padded, "zstd", Digest("ef" * 32), size)


def test_a_planes_stream_in_memory_past_what_the_size_allows_is_refused() -> None:
    size = 4000
    stored = codecs.pack_planes(bytes(range(250)) * 16, 4)
    assert plane_stream(stored, "planes4", Digest("ef" * 32), size, 4) is not None
    with pytest.raises(IntegrityError, match="stored bytes its size allows"):
        plane_stream(stored + bytes(stored_max(size)), "planes4", Digest("ef" * 32), size, 4)


@pytest.mark.parametrize("expect", [0, 10, 999, 1000, 1001, None])
def test_stored_bytes_read_whole_whatever_length_was_expected(expect: int | None) -> None:
    stored = bytes(range(200)) * 5
    assert read_capped(io.BytesIO(stored), Digest("ef" * 32), 1000, where="X",
                       expect=expect) == stored
    cap = codecs.HEADER + stored_max(10)
    with pytest.raises(IntegrityError, match="stored bytes its size allows"):
        read_capped(io.BytesIO(bytes(cap + 1)), Digest("ef" * 32), 10, where="X", expect=expect)


def test_an_unknown_codec_is_refused() -> None:
    with pytest.raises(Exception, match="unknown codec 'xor'"):
        decode(b"abc", "xor", Digest("01" * 32), 3)
