"""A checkpoint's page and downloads: its files as one tar stream and one by one, its model
summary; the compare page's unique labels; the lineage page opening collapsed."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import math
import re
import subprocess
import tarfile
import tracemalloc
from html import unescape
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from nscas.objects.digests import Digest
from nscas.store.lineage import lineage
from nscas.store.opening import open_store
from nscas.store.writer import init_store
from nscas.ui import files
from nscas.ui.app import make_app
from nscas.ui.graph import build_graph
from tests.ui.client import fetch, get
from tests.ui.conftest import Demo, Hostile
from tests.ui.test_routes import one_sentence


def headers_of(text: str, table_class: str) -> list[str]:
    m = re.search(rf'<table class="{table_class}"><thead><tr>(.*?)</tr></thead>', text, re.S)
    assert m, table_class
    return [unescape(h) for h in re.findall(r"<th>(.*?)</th>", m.group(1), re.S)]


# ------------------------------------------------------------------ downloads


def test_a_checkpoint_downloads_as_a_tar_of_its_files(demo: Demo, tmp_path: Path) -> None:
    oid = demo.output("train", "checkpoint")
    entries = demo.record(demo.record(oid)["files"])["entries"]
    r = get(demo.store_dir, f"/files/{oid}")
    assert r.status == 200 and r.headers["Content-Type"] == "application/x-tar"
    assert r.headers["Content-Length"] == str(len(r.body))
    top = f"checkpoint-{oid.hex[:16]}"
    assert r.headers["Content-Disposition"] == f'attachment; filename="{top}.tar"'
    with tarfile.open(fileobj=io.BytesIO(r.body)) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == [f"{top}/{p}" for p in sorted(entries)]
        for m in members:
            entry = entries[m.name.removeprefix(top + "/")]
            data = tar.extractfile(m).read()  # type: ignore[union-attr]
            assert data == demo.store.get_bytes(Digest.parse(entry["id"]))
            assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    # GNU tar reads it too, and extracts exactly the folder the store materialises.
    (tmp_path / "x.tar").write_bytes(r.body)
    subprocess.run(["tar", "-xf", "x.tar"], cwd=tmp_path, check=True)
    demo.store.materialise(Digest.parse(demo.record(oid)["files"]), tmp_path / "want")
    for path in entries:
        assert (tmp_path / top / path).read_bytes() == (tmp_path / "want" / path).read_bytes()
    head = get(demo.store_dir, f"/files/{oid}", method="HEAD")
    assert head.status == 200 and head.body == b""
    assert head.headers["Content-Length"] == str(len(r.body))
    # a tree downloads the same way, under its own name
    tree = demo.record(oid)["files"]
    assert get(demo.store_dir, f"/files/{tree}").body.startswith(b"tree-")
    # asking /raw to download a folder gets its files; the record stays readable as JSON
    moved, record = fetch(demo.store_dir, f"/raw/{oid}?download=1", f"/raw/{oid}")
    assert moved.status == 302 and moved.headers["Location"] == f"/files/{oid}"
    assert record.status == 200 and json.loads(record.body) == demo.record(oid)


def test_each_file_downloads_under_its_own_name(demo: Demo) -> None:
    oid = demo.output("train", "checkpoint")
    entries = demo.record(demo.record(oid)["files"])["entries"]
    page = get(demo.store_dir, f"/object/{oid}").text
    links = [unescape(x) for x in re.findall(r'class="file-download" href="([^"]+)"', page)]
    assert links == [f"/files/{oid}?path={p}" for p in sorted(entries)]
    assert re.search(rf'id="download" href="/files/{oid}"', page)
    for path, r in zip(sorted(entries), fetch(demo.store_dir, *links), strict=True):
        assert r.status == 200 and r.body == demo.store.get_bytes(
            Digest.parse(entries[path]["id"]))
        assert r.headers["Content-Disposition"] == f'attachment; filename="{path}"'
        assert r.headers["Content-Type"] == "application/octet-stream"
        assert "sandbox" in r.headers["Content-Security-Policy"]


def test_what_is_no_folder_or_no_file_of_it_is_refused_in_one_sentence(demo: Demo) -> None:
    oid = demo.output("train", "checkpoint")
    blob = demo.output("eval-seed", "generations")
    for path, status in ((f"/files/{blob}", 400), (f"/files/{demo.receipt('train')}", 400),
                         (f"/files/{oid}?path=nope.json", 404), (f"/files/{oid}?path=", 200),
                         (f"/files/{oid}?path=a%00b", 400), (f"/files/{oid}?zzz=1", 400),
                         (f"/files/{oid}?path=config.json&path=config.json", 400),
                         ("/files/blake3:" + "1" * 64, 404)):
        r = get(demo.store_dir, path)
        assert r.status == status, (path, r.text[:300])
        if status != 200:
            one_sentence(r.text)


def test_hostile_file_names_are_escaped_and_download_by_name(hostile: Hostile) -> None:
    page = get(hostile.store_dir, f"/object/{hostile.tree}").text
    assert "<img src=x" not in page and 'onerror="window' not in page
    links = [unescape(x) for x in re.findall(r'class="file-download" href="([^"]+)"', page)]
    assert len(links) == len(get_entries(hostile))
    named = next(link for link in links if "onerror" in link)
    r = get(hostile.store_dir, named)
    assert r.status == 200 and r.body == b"named"
    # the name is percent-encoded in the header: nothing of it can end the header field
    assert r.headers["Content-Disposition"].startswith('attachment; filename="%3Cimg%20src')
    tar = get(hostile.store_dir, f"/files/{hostile.tree}")
    with tarfile.open(fileobj=io.BytesIO(tar.body)) as t:
        assert sorted(m.name.partition("/")[2] for m in t.getmembers()) == sorted(
            get_entries(hostile))


def get_entries(h: Hostile) -> dict[str, dict[str, object]]:
    store = open_store(h.store_dir, readonly=True)
    try:
        return store.get_record(h.tree)["entries"]
    finally:
        store.close()


# ------------------------------------------------------------------ streaming, measured


def test_the_tar_streams_in_bounded_memory(tmp_path: Path) -> None:
    """Four 24 MiB files (96 MiB): the server never holds more than a leaf or so of them."""
    store = init_store(tmp_path)
    folder = tmp_path / "big"
    folder.mkdir()
    block = hashlib.sha256(b"seed").digest() * (1 << 15)  # 1 MiB, not compressible to nothing
    for n in range(4):
        with open(folder / f"part-{n}.bin", "wb") as f:
            for i in range(24):
                f.write(bytes([n, i]) + block[2:])
    tree = store.put_tree(folder)
    store.close()
    total = 4 * 24 << 20

    async def download() -> tuple[int, int, str]:
        reader = open_store(tmp_path / ".nscas", readonly=True)
        try:
            async with TestClient(TestServer(make_app(reader))) as client:
                tracemalloc.start()  # before the request: a server that built the archive
                resp = await client.get(f"/files/{tree}")  # first would be caught too
                assert resp.status == 200
                length = int(resp.headers["Content-Length"])
                digest = hashlib.sha256()
                async for piece in resp.content.iter_chunked(1 << 16):
                    digest.update(piece)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
                return length, peak, digest.hexdigest()
        finally:
            reader.close()

    length, peak, digest = asyncio.run(download())
    assert length > total
    reader = open_store(tmp_path / ".nscas", readonly=True)
    try:
        archive = files.folder(reader, tree)
    finally:
        reader.close()
    want = hashlib.sha256()
    for header, entry in archive.headers():
        want.update(header)
        want.update((folder / entry.path).read_bytes())
        want.update(files.padding(entry.size))
    want.update(files.END)
    assert digest == want.hexdigest()
    assert length == archive.tar_size()
    print(f"tar of {total >> 20} MiB streamed with a peak of {peak / 2**20:.1f} MiB traced")
    assert peak < 48 << 20, f"peak {peak / 2**20:.1f} MiB while streaming {total >> 20} MiB"


# ------------------------------------------------------------------ the model page


def test_a_checkpoint_page_summarises_the_model(demo: Demo) -> None:
    oid = demo.output("train", "checkpoint")
    record = demo.record(oid)
    page = get(demo.store_dir, f"/object/{oid}").text
    section = re.search(r'<section id="model">(.*?)</section>', page, re.S)
    assert section, page[:2000]
    facts = dict(zip(re.findall(r"<dt>(.*?)</dt>", section.group(1)),
                     re.findall(r"<dd>(.*?)</dd>", section.group(1), re.S), strict=True))
    files = demo.record(record["files"])["entries"]
    config = json.loads(demo.store.get_bytes(Digest.parse(files["config.json"]["id"])))
    assert facts["architecture"].startswith(config["architectures"][0])
    assert f"layers {config['num_hidden_layers']}" in facts["architecture"]
    tensors = demo.record(record["params"])["tensors"]
    parameters = sum(math.prod(t["shape"]) for t in tensors.values())
    init_claims = demo.record(demo.receipt("init"))["claims"]
    assert parameters == init_claims["parameters"]["value"]  # the init run's own count
    assert facts["parameters"].startswith(f"{parameters:,}")
    assert f"in {len(tensors)} tensors" in facts["parameters"]
    assert facts["dtype"] == "F32"
    assert re.match(r"\d[\d.]* (KiB|MiB) of weights; \d[\d.]* (KiB|MiB) in \d+ files",
                    facts["size"])
    # lineage: this checkpoint (made by train), then the base it was trained from (by init)
    chain = re.findall(r"<li>(.*?)</li>", facts["lineage"], re.S)
    assert len(chain) == 2
    assert chain[0].startswith(f"this checkpoint, step {record['step']}, made by train@")
    assert str(demo.receipt("train"))[:19] in chain[0]
    assert str(record["parent"])[:19] in chain[1] and "made by init@" in chain[1]
    assert str(demo.receipt("init"))[:19] in chain[1]


# ------------------------------------------------------------------ compare labels


def test_compare_labels_every_column_once(demo: Demo) -> None:
    seed, again = demo.receipt("eval-seed"), demo.receipt("eval-again")
    r = get(demo.store_dir, f"/compare?run={seed}&run={again}")
    assert r.status == 200
    for table in ("runs", "tasks"):
        labels = headers_of(r.text, table)
        assert len(labels) == len(set(labels)), (table, labels)
    tasks = headers_of(r.text, "tasks")
    # both evaluations are of the seed checkpoint: the step tells them apart
    assert tasks[4:] == ["seed · eval-seed", "seed · eval-again"]


def test_compare_labels_stay_unique_for_runs_named_twice(demo: Demo) -> None:
    seed, again = demo.receipt("eval-seed"), demo.receipt("eval-again")
    train = demo.receipt("train")
    r = get(demo.store_dir, f"/compare?run={seed}&run={again}&run={train}&run={seed}")
    assert r.status == 200
    labels = headers_of(r.text, "runs")
    assert len(labels) == len(set(labels)), labels


# ------------------------------------------------------------------ lineage, collapsed


def test_the_lineage_page_opens_collapsed_and_expands(demo: Demo) -> None:
    oid = demo.output("train", "checkpoint")
    collapsed, everything = fetch(demo.store_dir, f"/lineage/{oid}", f"/lineage/{oid}?depth=all")
    near = build_graph([(lineage(demo.store, oid, depth=1), 0)])
    full = build_graph([(lineage(demo.store, oid), 0)])
    assert collapsed.text.count('<g class="node ') == len(near.nodes) < len(full.nodes)
    assert everything.text.count('<g class="node ') == len(full.nodes)
    # the target and what it was made from one link away: its parent, params, files, the run
    record = demo.record(oid)
    for linked in (record["parent"], record["params"], record["files"],
                   str(demo.receipt("train"))):
        assert f'data-key="{linked}"' in collapsed.text
    assert 'id="expand-all"' in collapsed.text and 'class="expand"' in collapsed.text
    assert 'id="collapse"' in everything.text
    # a receipt's inputs are its action's: two links from it
    receipt = demo.receipt("eval-again")
    page = get(demo.store_dir, f"/lineage/{receipt}").text
    assert page.count('<g class="node ') == len(
        build_graph([(lineage(demo.store, receipt, depth=2), 0)]).nodes)


@pytest.mark.parametrize("config", ["[" * 200_000 + "]" * 200_000, '["a list"]', "not json",
                                    '{"architectures": [7], "model_type": "<b>x</b>", '
                                    '"num_hidden_layers": true, "hidden_size": 99}'])
def test_a_hostile_config_leaves_the_summary_standing(tmp_path: Path, config: str) -> None:
    """Whatever config.json holds, the page shows what it can read, escaped, and the rest as
    unknown: never a server error."""
    import numpy as np
    from safetensors.numpy import save_file

    from nscas.models.checkpoints import put_checkpoint

    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": np.zeros((3, 4), dtype=np.float32), "b": np.zeros(4, dtype=np.float16)},
              str(model / "model.safetensors"))
    (model / "config.json").write_text(config)
    store = init_store(tmp_path)
    oid = put_checkpoint(store, model, step=0, parent=None)
    store.close()
    r = get(tmp_path / ".nscas", f"/object/{oid}")
    assert r.status == 200
    section = re.search(r'<section id="model">(.*?)</section>', r.text, re.S)
    assert section
    text = unescape(re.sub(r"<[^>]+>", "", section.group(1)))
    assert "parameters16 in 2 tensors" in text.replace("\n", "")
    assert "F32 (12 parameters), F16 (4 parameters)" in text
    assert "56 bytes of weights" in text  # 12 x 4 + 4 x 2
    if config.startswith('{"arch'):
        assert "<b>x</b>" not in r.text and "&lt;b&gt;x&lt;/b&gt;" in r.text
        assert "hidden size 99" in text and "layers" not in text
    else:
        assert "not named by a config.json" in text


def test_long_and_unicode_names_get_pax_headers_of_the_announced_length() -> None:
    """Names past ustar's 100 bytes, or not ASCII, take a pax header; the length announced is
    still the archive's, and tarfile reads every name and byte back."""
    data = {"a" * 180 + "/weights.bin": b"x" * 1000, "tokenizer – ü.json": b"{}",
            "empty": b"", "block": b"y" * 512}
    archive = files.Folder(tree=Digest.parse("blake3:" + "0" * 64), name="tree-0000000000000000",
                           entries=tuple(files.FileEntry(path=p, id=Digest.parse(
                               "blake3:" + "1" * 64), size=len(b)) for p, b in sorted(data.items())))
    out = io.BytesIO()
    for header, entry in archive.headers():
        out.write(header + data[entry.path] + files.padding(entry.size))
    out.write(files.END)
    assert len(out.getvalue()) == archive.tar_size()
    assert len(out.getvalue()) % files.BLOCK == 0
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        got = {m.name.removeprefix("tree-0000000000000000/"): tar.extractfile(m).read()  # type: ignore[union-attr]
               for m in tar.getmembers()}
    assert got == data


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../../b", "a//b", "./a", "a\\b",
                                  "a/", "", "a\x00b", "\ud800"])
def test_a_path_out_of_the_folder_is_not_safe(path: str) -> None:
    assert not files.safe_path(path)


@pytest.mark.parametrize("path", ["config.json", "sub/page.html", "a b/ü.txt", "...", "a..b"])
def test_a_relative_path_inside_the_folder_is_safe(path: str) -> None:
    assert files.safe_path(path)
