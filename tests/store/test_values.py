"""The store's small value types: Digest (written out, not a dataclass, for the read commands'
start-up) and the NamedTuples of reads and configs keep what their dataclass forms promised:
equal by value, hashable, ordered where IDs are, unchangeable, and pickled whole."""

from __future__ import annotations

import copy
import pickle

import pytest

from nscas.errors import InvalidDigest
from nscas.objects.digests import Digest
from nscas.store.config import S3Settings, StoreConfig
from nscas.store.reading import Link, ObjectInfo

A, B = Digest("a" * 64), Digest("b" * 64)


def test_a_digest_is_equal_hashable_and_ordered_by_its_hex() -> None:
    assert Digest("a" * 64) == A and hash(Digest("a" * 64)) == hash(A)
    assert A != B and len({A, Digest("a" * 64), B}) == 2
    assert A < B <= B and B > A >= A and sorted([B, A]) == [A, B]
    assert A != "a" * 64 and str(A) != A and A != ("a" * 64,)
    with pytest.raises(TypeError):
        _ = A < "b" * 64


def test_a_digest_cannot_change() -> None:
    d = Digest("c" * 64)
    with pytest.raises(AttributeError):
        d.hex = "d" * 64  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del d.hex
    with pytest.raises(AttributeError):
        d.other = 1  # type: ignore[attr-defined]
    assert d.hex == "c" * 64


@pytest.mark.parametrize("text", ["", "A" * 64, "a" * 63, "a" * 65, "g" * 64, " " + "a" * 63])
def test_a_digest_is_64_lowercase_hex_digits(text: str) -> None:
    with pytest.raises(InvalidDigest):
        Digest(text)


def test_a_digest_survives_pickle_and_copy_as_itself() -> None:
    for again in (pickle.loads(pickle.dumps(A)), copy.copy(A), copy.deepcopy(A)):
        assert again == A and type(again) is Digest and again.hex == A.hex
    # a pickle cannot make a Digest that the constructor would refuse
    forged = pickle.dumps(A).replace(b"a" * 64, b"z" * 64)
    with pytest.raises(InvalidDigest):
        pickle.loads(forged)


def test_a_digest_matches_by_its_field() -> None:
    match A:
        case Digest(hex=h):
            assert h == "a" * 64
        case _:
            pytest.fail("no match")


def test_read_values_are_equal_by_value_and_cannot_change() -> None:
    link = Link(parent=A, path="$.x", child=B)
    assert link == Link(parent=A, path="$.x", child=B) and hash(link) == hash(Link(A, "$.x", B))
    with pytest.raises(AttributeError):
        link.path = "$.y"  # type: ignore[misc]
    info = ObjectInfo(id=A, size=1, sha256=None, kind=None, storage="inline", codec="raw",
                      stored_size=1, created=0.0)
    assert info._replace(sha256="0" * 64).sha256 == "0" * 64 and info.sha256 is None
    config = StoreConfig(database="postgresql://h/db", objects="/shared")
    assert config.s3 == S3Settings() and pickle.loads(pickle.dumps(config)) == config
