"""Every page and error path of the UI through aiohttp's test client, checked against the store."""

from __future__ import annotations

import hashlib
import json
import re
from html import unescape
from html.parser import HTMLParser

import pytest

from nscas.objects.digests import Digest
from nscas.runs.side_by_side import headline_claims
from nscas.store.lineage import lineage, to_dot
from nscas.ui.graph import build_graph
from nscas.ui.render import human
from nscas.ui.views import HEADLINE_SHOWN
from tests.ui.client import fetch, get
from tests.ui.conftest import Demo, Hostile


def rows(text: str, table_class: str) -> list[str]:
    """The body rows of the first table of this class."""
    m = re.search(rf'<table class="{table_class}">.*?<tbody>(.*?)</tbody>', text, re.S)
    assert m, table_class
    return re.findall(r"<tr.*?</tr>", m.group(1), re.S)


def one_sentence(text: str) -> str:
    m = re.search(r'<p class="error-message">(.*?)</p>', text, re.S)
    assert m, text[:500]
    sentence = unescape(m.group(1)).strip()
    assert sentence.endswith(".") and "Traceback" not in text
    return sentence


# ------------------------------------------------------------------ pages on the demo store


def test_experiments_lists_every_receipt_and_ref(demo: Demo) -> None:
    r = get(demo.store_dir, "/")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/html")
    receipts = [info.id for info in demo.store.log(kind="receipt/1", limit=1000)]
    shown = re.findall(r'name="run" value="(blake3:[0-9a-f]{64})"', r.text)
    assert shown == [str(x) for x in receipts]  # newest first, as the store lists them
    assert "experiments/ui/trained" in r.text
    train = demo.record(demo.receipt("train"))
    shown = list(headline_claims(train["claims"]).items())[:HEADLINE_SHOWN]
    assert shown and all(f"{k}={human(v)}" in r.text for k, v in shown)


def test_experiment_filters(demo: Demo) -> None:
    train, failed, by_ref = fetch(demo.store_dir, "/?recipe=train", "/?status=failed",
                                  "/?ref=experiments/ui/")
    assert re.findall(r'name="run" value="([^"]+)"', train.text) == [str(demo.receipt("train"))]
    assert "No receipt matches these filters." in failed.text
    # the ref names train's checkpoint: its producer is the one receipt listed
    assert re.findall(r'name="run" value="([^"]+)"', by_ref.text) == [str(demo.receipt("train"))]


@pytest.mark.parametrize("query", ["status=bogus", "limit=0", "limit=x", "zzz=1",
                                   "recipe=%3Cscript%3E", "status=failed&status=succeeded"])
def test_bad_queries_are_400_with_one_sentence(demo: Demo, query: str) -> None:
    r = get(demo.store_dir, f"/?{query}")
    assert r.status == 400
    one_sentence(r.text)


def test_receipt_page_shows_the_receipt(demo: Demo) -> None:
    oid = demo.receipt("train")
    rec = demo.record(oid)
    action = demo.record(rec["action"])
    r = get(demo.store_dir, f"/receipt/{oid}")
    assert r.status == 200
    for name, target in [*action["inputs"].items(), *rec["outputs"].items()]:
        assert name in r.text and f'href="/object/{target}"' in r.text
    for claim in rec["claims"].values():
        assert f"<td>{claim['verifier']}</td>" in r.text
    assert r.text.count('<svg class="chart"') == 2  # loss and learning rate
    # one curve per journal (rank) in each chart
    assert len(re.findall(r"<polyline", r.text)) == 2 * len(rec["journals"])
    for journal in rec["journals"]:
        assert f'href="/object/{journal}"' in r.text
    assert f'data-src="/verify/{oid}"' in r.text


def test_receipt_page_by_ref_and_prefix(demo: Demo) -> None:
    oid = str(demo.receipt("eval-again"))
    by_prefix = get(demo.store_dir, f"/receipt/{oid[7:19]}")
    assert by_prefix.status == 200 and oid in by_prefix.text
    assert 'id="compare-baseline"' in by_prefix.text  # evaluate with a baseline


def test_unknown_and_wrong_ids(demo: Demo) -> None:
    missing, bad, blob_as_receipt, short = fetch(
        demo.store_dir, "/object/blake3:" + "0" * 64, "/object/not a ref!",
        f"/receipt/{demo.output('eval-seed', 'checks')}", "/lineage/abc")
    assert missing.status == 404
    assert one_sentence(missing.text) == f"This store has no blake3:{'0' * 64}."
    assert bad.status in (400, 404) and one_sentence(bad.text)
    assert blob_as_receipt.status == 400 and "not a receipt" in one_sentence(blob_as_receipt.text)
    assert short.status == 404 and one_sentence(short.text)
    nowhere = get(demo.store_dir, "/no/such/page")
    assert nowhere.status == 404 and one_sentence(nowhere.text) == "No page at this address."


def test_object_page_links_both_ways(demo: Demo) -> None:
    oid = demo.record(demo.receipt("train"))["action"]
    r = get(demo.store_dir, f"/object/{oid}")
    assert r.status == 200
    for link in demo.store.links_from(Digest.parse(oid)):
        assert f"<code>{link.path}</code>" in r.text and f'href="/object/{link.child}"' in r.text
    for link in demo.store.links_to(Digest.parse(oid)):
        assert f'/receipt/{link.parent}"' in r.text or f'/object/{link.parent}"' in r.text


def test_jsonl_blob_is_a_paged_table(demo: Demo) -> None:
    tasks = demo.record(demo.output("prepare", "train"))
    oid = tasks["records"]
    first, second, past = fetch(demo.store_dir, f"/object/{oid}", f"/object/{oid}?page=2",
                                f"/object/{oid}?page=99")
    assert first.status == 200 and "(jsonl" in first.text
    table = rows(first.text, "jsonl")
    assert len(table) == min(50, tasks["count"])
    assert tasks["ids"][0] in table[0]
    if tasks["count"] > 50:
        assert second.status == 200
    else:
        assert second.status == 400
    assert past.status == 400 and "fewer lines" in one_sentence(past.text)


def test_safetensors_header_is_a_tensor_table(demo: Demo) -> None:
    files = demo.record(demo.record(demo.output("init", "checkpoint"))["files"])
    oid = files["entries"]["model.safetensors"]["id"]
    r = get(demo.store_dir, f"/object/{oid}")
    assert r.status == 200
    data = demo.store.get_bytes(Digest.parse(oid))
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = rows(r.text, "tensors")
    assert len(body) == len(header)
    for name in header:
        assert f"<td>{name}</td>" in r.text


def test_raw_download_streams_the_exact_bytes(demo: Demo) -> None:
    oid = demo.output("eval-seed", "generations")
    data = demo.store.get_bytes(oid)
    down, inline = fetch(demo.store_dir, f"/raw/{oid}?download=1", f"/raw/{oid}")
    assert down.body == data and down.headers["Content-Length"] == str(len(data))
    assert down.headers["Content-Disposition"].startswith("attachment")
    assert down.headers["Content-Type"] == "application/octet-stream"
    assert inline.headers["Content-Type"].startswith("text/plain")
    assert "sandbox" in inline.headers["Content-Security-Policy"]
    assert inline.headers["X-Content-Type-Options"] == "nosniff"
    head = get(demo.store_dir, f"/raw/{oid}", method="HEAD")
    assert head.status == 200 and head.body == b""
    assert get(demo.store_dir, f"/raw/{oid}?download=yes").status == 400


def test_lineage_page_is_the_dot_graph(demo: Demo) -> None:
    oid = demo.receipt("eval-again")
    page, dot = fetch(demo.store_dir, f"/lineage/{oid}?depth=all", f"/dot/{oid}")
    assert page.status == 200 and dot.status == 200
    root = lineage(demo.store, oid)
    assert dot.text == to_dot(root)
    graph = build_graph([(root, 0)])
    assert page.text.count('<g class="node ') == len(graph.nodes)
    assert page.text.count('<g class="edge">') == len(graph.edges)


def test_lineage_options_and_expand(demo: Demo) -> None:
    oid = demo.receipt("eval-again")
    small = get(demo.store_dir, f"/lineage/{oid}?max_nodes=4&direction=up&hide=code")
    assert small.status == 200
    expandable = re.findall(r'class="expand"', small.text)
    assert expandable
    target = demo.record(oid)["action"]
    grown = get(demo.store_dir, f"/lineage/{oid}?max_nodes=4&hide=code&expand={target}")
    assert grown.text.count('<g class="node ') > small.text.count('<g class="node ')
    down = get(demo.store_dir, f"/lineage/{demo.output('prepare', 'test')}?direction=down")
    assert down.status == 200 and str(demo.receipt("eval-seed")) in down.text
    for query in ("direction=sideways", "hide=nothing", "depth=-1", "max_nodes=0"):
        r = get(demo.store_dir, f"/lineage/{oid}?{query}")
        assert r.status == 400, query
        one_sentence(r.text)


def test_compare_pairs_the_answers(demo: Demo) -> None:
    seed, again = demo.receipt("eval-seed"), demo.receipt("eval-again")
    r = get(demo.store_dir, f"/compare?run={seed}&run={again}")
    assert r.status == 200
    claims = {k: v["value"] for k, v in demo.record(again)["claims"].items()}
    (pair,) = rows(r.text, "pairs")
    cells = re.findall(r"<td[^>]*>(.*?)</td>", pair, re.S)
    assert cells[4] == str(claims["wins"]) and cells[5] == str(claims["losses"])
    assert float(cells[7]) == pytest.approx(claims["exact_one_sided_p"], rel=1e-3)
    tasks = demo.record(demo.output("prepare", "test"))
    assert len(rows(r.text, "tasks")) == tasks["count"]
    checks = [json.loads(x) for x in
              demo.store.get_bytes(demo.output("eval-seed", "checks")).decode().splitlines()]
    verdicts = re.findall(r'<td class="answer (right|wrong)">', r.text)
    assert verdicts[0::2] == ["right" if c["correct"] else "wrong" for c in checks]


def test_compare_filters_and_errors(demo: Demo) -> None:
    seed, again = demo.receipt("eval-seed"), demo.receipt("eval-again")
    base = f"/compare?run={seed}&run={again}"
    records = [json.loads(x) for x in demo.store.get_bytes(Digest.parse(
        demo.record(demo.output("prepare", "test"))["records"])).decode().splitlines()]
    family = records[0]["task"]["family"]
    fam = get(demo.store_dir, f"{base}&family={family}")
    assert len(rows(fam.text, "tasks")) == sum(r["task"]["family"] == family for r in records)
    right = get(demo.store_dir, f"{base}&verdict=all-correct")
    assert right.status == 200 and 'class="answer wrong"' not in right.text
    assert get(demo.store_dir, "/compare", ).status == 302
    for query in (f"run={seed}", f"{base[9:]}&family=nope", f"{base[9:]}&verdict=maybe",
                  f"{base[9:]}&page=9", "run=blake3:" + "1" * 64 + f"&run={seed}"):
        r = get(demo.store_dir, f"/compare?{query}")
        assert r.status in (400, 404), query
        one_sentence(r.text)
    mixed = get(demo.store_dir, f"/compare?run={seed}&run={demo.receipt('train')}")
    assert mixed.status == 200 and 'id="no-per-task"' in mixed.text


# ------------------------------------------------------------------ the security model


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_only_get_and_head(demo: Demo, method: str) -> None:
    r = get(demo.store_dir, "/", method=method)
    assert r.status == 405 and r.headers["Allow"] == "GET, HEAD"
    one_sentence(r.text)


def test_a_foreign_host_header_is_refused(demo: Demo) -> None:
    r = get(demo.store_dir, "/", headers={"Host": "evil.example:8765"})
    assert r.status == 421 and str(demo.receipt("train")) not in r.text
    assert get(demo.store_dir, "/", headers={"Host": "localhost:1"}).status == 200


def test_every_page_has_a_strict_csp(demo: Demo) -> None:
    r = get(demo.store_dir, "/")
    csp = r.headers["Content-Security-Policy"]
    script = next(p for p in csp.split(";") if p.strip().startswith("script-src"))
    assert script.split() == ["script-src", "'self'"]
    assert "frame-ancestors 'none'" in csp and r.headers["X-Frame-Options"] == "DENY"
    assert "<script>" not in r.text and not re.search(r"<script(?![^>]*\bsrc=)", r.text)


def test_no_route_writes(demo: Demo, hostile: Hostile) -> None:
    db = demo.store_dir / "nscas.db"
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    oid = demo.receipt("eval-again")
    replies = fetch(demo.store_dir, "/", f"/receipt/{oid}", f"/object/{oid}", f"/lineage/{oid}",
                    f"/compare?run={demo.receipt('eval-seed')}&run={oid}")
    assert all(r.status == 200 for r in replies)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


class Elements(HTMLParser):
    """The script sources and event-handler attributes of a page, as a browser parses it."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str | None] = []
        self.handlers: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self.scripts.append(dict(attrs).get("src"))
        self.handlers += [(tag, k) for k, _ in attrs if k.lower().startswith("on")]


def hostile_pages(h: Hostile) -> list[str]:
    return ["/", "/?ref=hostile/", f"/receipt/{h.receipt}", f"/object/{h.receipt}",
            f"/object/{h.action}", f"/object/{h.tree}", f"/object/{h.tasks}",
            f"/object/{h.html}", f"/object/{h.svg}", f"/object/{h.jsonl}", f"/object/{h.text}",
            f"/lineage/{h.receipt}", f"/lineage/{h.jsonl}?direction=down",
            f"/compare?run={h.baseline}&run={h.receipt}", "/object/hostile/page"]


def test_hostile_strings_are_escaped_everywhere(hostile: Hostile) -> None:
    from tests.ui.conftest import ATTR, PAYLOAD

    pages = hostile_pages(hostile)
    for path, r in zip(pages, fetch(hostile.store_dir, *pages), strict=True):
        assert r.status == 200, (path, r.text[:300])
        assert PAYLOAD not in r.text and "<script>window" not in r.text, path
        assert '<svg onload' not in r.text and "<img src=x" not in r.text, path
        elements = Elements()
        elements.feed(r.text)
        assert elements.scripts == ["/static/ui.js"], path  # the one script, no inline one
        assert not elements.handlers, (path, elements.handlers)  # no on* attribute anywhere
    # and the payload is there, as text, where a page shows it
    receipt = get(hostile.store_dir, f"/receipt/{hostile.receipt}").text
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in receipt
    assert unescape(ATTR) in unescape(receipt)
    compare = get(hostile.store_dir, f"/compare?run={hostile.baseline}&run={hostile.receipt}")
    assert compare.text.count("&lt;script&gt;window.__pwned=1&lt;/script&gt;") >= 9


def test_hostile_html_and_svg_are_framed_and_sandboxed(hostile: Hostile) -> None:
    page = get(hostile.store_dir, f"/object/{hostile.html}").text
    assert re.search(r'<iframe class="preview" sandbox=""', page)
    assert "allow-scripts" not in page and "allow-same-origin" not in page
    svg = get(hostile.store_dir, f"/object/{hostile.svg}").text
    assert f'<img class="preview" src="/raw/{hostile.svg}"' in svg
    for oid, media in ((hostile.html, "text/html"), (hostile.svg, "image/svg+xml")):
        raw = get(hostile.store_dir, f"/raw/{oid}")
        assert raw.headers["Content-Type"].startswith(media)
        assert raw.headers["Content-Security-Policy"].startswith("sandbox;")
        assert "script-src" not in raw.headers["Content-Security-Policy"]
