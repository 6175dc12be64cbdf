"""Fuzzing the request parsers of a replica and of ``nscas ui`` (hypothesis): whatever a client
sends, the answer is never a 5xx and the server serves on.

Bounded for CI: ``NSCAS_FUZZ_EXAMPLES`` inputs per test (default 200); docs/serving.md gives
the count and command of the longer measured run.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nscas.recipes.serve.protocol import (
    RequestRejected,
    parse_chat,
    parse_infer,
    parse_json_body,
    parse_text_completion,
)
from tests.ui.conftest import Hostile, build_hostile

from .conftest import Served
from .servers import Running, read_until_closed, replica_server, status_of, ui_server

EXAMPLES = int(os.environ.get("NSCAS_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
COUNTED: dict[str, int] = {}

# -- JSON bodies that look like what the replica takes, and break it everywhere -----------------

_text = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=12)
_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**30), 10**30),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0, 1, 2, 1e-45, -0.0, 2.5]),
    _text)
_json = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)), max_leaves=8)
_messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", 1]),
     "content": st.one_of(_text, _json)}, optional={"name": _json}), min_size=0, max_size=3)
_known = st.fixed_dictionaries({}, optional={
    "messages": st.one_of(_messages, _json), "prompt": st.one_of(_text, _json),
    "max_tokens": st.one_of(st.integers(1, 3), _json), "max_completion_tokens": _json,
    "temperature": st.one_of(st.floats(0, 2), _json), "top_p": st.one_of(st.floats(0, 1), _json),
    "seed": st.one_of(st.integers(-(2**70), 2**70), _json), "stop": _json, "stream": _json,
    "stream_options": _json, "n": _json, "logit_bias": _json, "user": _json, "model": _json,
    "request_id": st.one_of(_text, _json), "task_id": st.one_of(_text, _json)})
_members = st.builds(lambda known, other: {**other, **known}, _known,
                     st.dictionaries(_text, _json, max_size=2))
_huge_integer = st.integers(4000, 6000).map(lambda n: "9" * n)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    """A body: a JSON object of the members above, then perhaps bent (a member's value
    swapped for a 5,000-digit integer or a lone surrogate, a byte changed, the end cut)."""
    text = json.dumps(draw(_members))
    how = draw(st.sampled_from(["as-is", "huge", "surrogate", "byte", "cut", "deep"]))
    if how == "huge" and text.endswith("}") and len(text) > 2:
        text = text[:-1] + f', "seed": {draw(_huge_integer)}}}'
    elif how == "surrogate" and '"' in text:
        at = draw(st.integers(0, text.count('"') - 1))
        parts = text.split('"')
        parts[at] += "\\udc80" if at % 2 else ""
        text = '"'.join(parts)
    elif how == "deep":
        depth = draw(st.integers(20, 3000))
        text = "[" * depth + "]" * depth
    data = text.encode("utf-8", "surrogatepass")
    if how == "byte" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    elif how == "cut" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    return data


@FUZZ
@given(body=bodies())
def test_replica_body_parsers_refuse_only_with_4xx(body: bytes) -> None:
    COUNTED["parsers"] = COUNTED.get("parsers", 0) + 1
    for parse in (lambda v: parse_chat(v, default_max_tokens=8, limit=4096),
                  lambda v: parse_text_completion(v, default_max_tokens=8, limit=4096),
                  parse_infer):
        try:
            parse(parse_json_body(body))
        except RequestRejected as exc:
            assert 400 <= exc.status < 500
            assert exc.message and "\n" not in exc.message


# -- raw HTTP against the real servers ----------------------------------------------------------


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    return build_hostile(tmp_path_factory.mktemp("fuzz-store"))


@pytest.fixture(scope="module", params=["replica", "ui"])
def server(request: pytest.FixtureRequest, served: Served, hostile: Hostile,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    workdir = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    if request.param == "replica":
        with replica_server(served, workdir, "--max-connections", "64",
                            "--header-timeout", "20", "--body-timeout", "0.5") as running:
            yield running
    else:
        with ui_server(hostile.store_dir, workdir, header_timeout=20,
                       max_connections=64) as running:
            yield running


_REPLICA_PATHS = ["/health", "/stats", "/infer", "/v1/models", "/v1/models/x",
                  "/v1/chat/completions", "/v1/completions", "/", "/v1/../health"]
_UI_PATHS = ["/", "/receipt/", "/object/", "/lineage/", "/dot/", "/raw/", "/compare",
             "/static/", "/static/../app.py", "/nowhere"]
_token = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=20)


def _target(paths: list[str], ids: list[str]) -> st.SearchStrategy[bytes]:
    def build(path: str, tail: str, oid: str | None, query: list[tuple[str, str]]) -> bytes:
        from urllib.parse import quote

        target = path + (oid or quote(tail, safe="/%?&=+;"))
        if query:
            target += "?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in query)
        return target.encode()

    return st.builds(build, st.sampled_from(paths), _token,
                     st.one_of(st.none(), st.sampled_from(ids)),
                     st.lists(st.tuples(st.sampled_from(
                         ["page", "limit", "recipe", "status", "depth", "hide", "direction",
                          "max_nodes", "expand", "run", "download", "verdict", "x"]) | _token,
                         _token | st.sampled_from(["1", "0", "-1", "9" * 5000, "up"])),
                         max_size=4))


@st.composite
def http_requests(draw: st.DrawFn, paths: list[str], ids: list[str]) -> bytes:
    """A request line, headers and a body, each perhaps broken."""
    method = draw(st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS",
                                   b"G\x00T", b"BREW"]))
    target = draw(_target(paths, ids) | st.binary(min_size=1, max_size=60))
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 x"]))
    headers = [b"Host: 127.0.0.1", b"Connection: close"]
    headers += draw(st.lists(st.sampled_from([
        b"Content-Type: application/json", b"Content-Type: text/plain", b"Accept: text/html",
        b"Transfer-Encoding: chunked", b"Content-Encoding: gzip", b"Expect: 100-continue",
        b"Idempotency-Key: k", b"Idempotency-Key: \xff\xfe", b"Host: 127.0.0.1",
        b"X-\xff: y", b"Range: bytes=0-1", b"Content-Length: 3"]), max_size=3))
    body = draw(bodies()) if method == b"POST" else b""
    if not any(h.startswith(b"Content-Length") or h.startswith(b"Transfer") for h in headers):
        headers.append(b"Content-Length: %d" % len(body))
    return b"%s %s %s\r\n%s\r\n\r\n%s" % (method, target.replace(b"\r\n", b""), version,
                                          b"\r\n".join(headers), body)


def _fuzz(server: Running, data: Any, ids: list[str]) -> None:
    paths = _REPLICA_PATHS if server.kind == "replica" else _UI_PATHS
    raw = data.draw(http_requests(paths, ids))
    COUNTED[server.kind] = COUNTED.get(server.kind, 0) + 1
    with socket.create_connection(server.address, timeout=60) as sock:
        # Refused before it was all sent: what it answered still counts.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)
        answer = read_until_closed(sock, 60)
    status = status_of(answer)
    assert answer == b"" or 100 <= status < 500, (raw[:300], answer[:300])


@FUZZ
@given(data=st.data())
def test_no_request_gets_a_5xx(server: Running, hostile: Hostile, data: Any) -> None:
    ids = [str(hostile.receipt), str(hostile.jsonl), str(hostile.tree), "hostile/receipt",
           str(hostile.receipt)[:12]]
    _fuzz(server, data, ids)


def test_the_servers_serve_on_after_the_fuzz(server: Running) -> None:
    from .servers import wait_served

    assert wait_served(server) == 200
    assert "Traceback" not in server.log()
    print(f"fuzzed {COUNTED}")
