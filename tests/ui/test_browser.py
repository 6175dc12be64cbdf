"""``nscas ui`` in a real browser: Debian's headless Chromium driven by Playwright (never a
downloaded browser). Each page of the demo store is opened, lineage and a comparison are clicked
through, what is shown is checked against the store, screenshots are taken, and no page may log
a console error. The hostile store's pages must run no script at all.

Screenshots go to a temporary directory (``NSCAS_UI_SCREENS`` names another); with
``NSCAS_UI_SCREENSHOT=docs/ui.png`` the receipt page's screenshot is also saved there (the
README's picture).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nscas.store.lineage import lineage
from nscas.ui.graph import build_graph
from tests.ui.conftest import Demo, Hostile, Server, start_ui, stop_ui
from tests.waiting import GENEROUS

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (make system installs it)")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium refuses root otherwise
        b = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def demo_ui(demo: Demo) -> Iterator[Server]:
    server = start_ui(demo.store_dir)
    yield server
    stop_ui(server)


@pytest.fixture(scope="module")
def hostile_ui(hostile: Hostile) -> Iterator[Server]:
    server = start_ui(hostile.store_dir)
    yield server
    stop_ui(server)


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    named = os.environ.get("NSCAS_UI_SCREENS")
    out = Path(named) if named else tmp_path_factory.mktemp("ui-screens")
    out.mkdir(parents=True, exist_ok=True)
    return out


class Page:
    """A browser tab that records console errors and failed page scripts."""

    def __init__(self, browser: Any, base: str, screens: Path) -> None:
        self.tab = browser.new_page(viewport={"width": 1360, "height": 900})
        # Playwright's own 30 s default is a deadline a loaded machine can reach; every wait
        # here is for an event (a load, a URL, a selector), so a long one costs nothing.
        self.tab.set_default_timeout(GENEROUS * 1000)
        self.base = base
        self.screens = screens
        self.errors: list[str] = []
        self.tab.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.tab.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, path: str) -> Any:
        response = self.tab.goto(self.base + path)
        self.tab.wait_for_load_state("load")
        return response

    def shot(self, name: str) -> Path:
        path = self.screens / f"{name}.png"
        self.tab.screenshot(path=str(path))
        assert path.stat().st_size > 10_000
        return path

    def close(self) -> None:
        self.tab.close()


@pytest.fixture
def tab(browser: Any, demo_ui: Server, screens: Path) -> Iterator[Page]:
    page = Page(browser, demo_ui.url, screens)
    yield page
    errors = page.errors
    page.close()
    assert errors == [], errors


def test_experiments_receipt_and_verification(tab: Page, demo: Demo) -> None:
    from nscas.verifiers.verify import verify

    tab.open("/")
    receipts = demo.store.log(kind="receipt/1", limit=1000)
    assert tab.tab.locator("table.receipts tbody tr").count() == len(receipts)
    assert tab.tab.locator("table.refs").inner_text().count("experiments/ui/trained") == 1
    tab.shot("experiments")
    # click through to the training run: its loss and learning-rate curves
    train = str(demo.receipt("train"))
    tab.tab.click(f'a[href="/receipt/{train}"]')
    tab.tab.wait_for_url(f"**/receipt/{train}")
    assert tab.tab.locator("svg.chart").count() == 2
    assert tab.tab.locator("svg.chart polyline").count() == 2 * len(demo.record(train)["journals"])
    tab.shot("receipt-train")
    # verified from its page: every check shown as it comes, then the verdict
    oid = train
    tab.tab.click("#verify-button")
    tab.tab.wait_for_selector("#verify-summary.ok, #verify-summary.bad", timeout=180_000)
    report = verify(oid, store=demo.store_dir)
    assert tab.tab.inner_text("#verify-summary") == report.summary()
    names = tab.tab.locator("#verify-checks tbody tr td:nth-child(2)").all_inner_texts()
    assert names == [c.name for c in report.checks]
    shot = tab.shot("receipt-verified")
    wanted = os.environ.get("NSCAS_UI_SCREENSHOT")
    if wanted:
        shutil.copyfile(shot, ROOT / wanted if not Path(wanted).is_absolute() else wanted)


def _view_box(tab: Page) -> str:
    return tab.tab.get_attribute("#graph-svg", "viewBox") or ""


def test_lineage_pan_zoom_expand_and_click_through(tab: Page, demo: Demo) -> None:
    oid = demo.receipt("eval-again")
    tab.open(f"/lineage/{oid}")
    # collapsed: a receipt and what it was made from, two links away (its action's inputs)
    graph = build_graph([(lineage(demo.store, oid, depth=2), 0)])
    assert tab.tab.locator("g.node").count() == len(graph.nodes)
    tab.shot("lineage")
    _assert_fits(tab)
    box = tab.tab.locator("#graph").bounding_box()
    before = _view_box(tab)
    tab.tab.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    tab.tab.mouse.wheel(0, -400)
    zoomed = _view_box(tab)
    assert zoomed != before
    w0 = float(before.split()[2])
    assert float(zoomed.split()[2]) < w0  # zoomed in: a narrower view
    tab.tab.mouse.move(box["x"] + 200, box["y"] + 200)
    tab.tab.mouse.down()
    tab.tab.mouse.move(box["x"] + 320, box["y"] + 260, steps=5)
    tab.tab.mouse.up()
    assert _view_box(tab) != zoomed  # panned
    tab.tab.click('button[data-zoom="fit"]')
    # expanding a node cut short by --max-nodes grows the graph in place
    tab.open(f"/lineage/{oid}?max_nodes=4&hide=code")
    small = tab.tab.locator("g.node").count()
    tab.tab.locator("a.expand").first.click()
    tab.tab.wait_for_load_state("load")
    assert "expand=" in tab.tab.url and tab.tab.locator("g.node").count() > small
    # clicking a box opens that object
    seed = str(demo.receipt("eval-seed"))
    tab.open(f"/lineage/{oid}")
    tab.tab.click('button[data-zoom="fit"]')
    tab.tab.locator(f'g.node[data-key="{seed}"] a.node-link').click()
    tab.tab.wait_for_url(f"**/object/{seed}")
    assert seed in tab.tab.inner_text("h1")


def _assert_fits(tab: Page) -> None:
    """Every box of the graph lies inside the graph's frame, and the frame inside the page."""
    frame = tab.tab.locator("#graph").bounding_box()
    width = tab.tab.evaluate("document.documentElement.clientWidth")
    assert frame["x"] >= 0 and frame["x"] + frame["width"] <= width
    assert tab.tab.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scroll
    for i in range(tab.tab.locator("g.node rect").count()):
        b = tab.tab.locator("g.node rect").nth(i).bounding_box()
        assert frame["x"] - 1 <= b["x"] and b["x"] + b["width"] <= frame["x"] + frame["width"] + 1
        assert frame["y"] - 1 <= b["y"] and b["y"] + b["height"] <= frame["y"] + frame["height"] + 1


def test_a_checkpoint_lineage_opens_collapsed_fits_and_expands(tab: Page, demo: Demo) -> None:
    oid = demo.output("train", "checkpoint")
    tab.open(f"/lineage/{oid}")
    near = build_graph([(lineage(demo.store, oid, depth=1), 0)])
    assert tab.tab.locator("g.node").count() == len(near.nodes)
    _assert_fits(tab)
    # legible as it opens: a box is drawn at no less than half its size
    rect = tab.tab.locator("g.node.root rect").bounding_box()
    assert rect["width"] >= 0.5 * 232
    tab.shot("lineage-checkpoint")
    tab.tab.click("#expand-all")
    tab.tab.wait_for_url("**depth=all**")
    full = build_graph([(lineage(demo.store, oid), 0)])
    assert tab.tab.locator("g.node").count() == len(full.nodes) > len(near.nodes)
    tab.shot("lineage-checkpoint-all")
    tab.tab.click("#collapse")
    tab.tab.wait_for_load_state("load")
    assert tab.tab.locator("g.node").count() == len(near.nodes)


def test_a_checkpoint_page_summarises_it_and_downloads_its_files(tab: Page, demo: Demo) -> None:
    import io
    import tarfile

    oid = demo.output("train", "checkpoint")
    tab.open(f"/object/{oid}")
    summary = tab.tab.inner_text("#model")
    assert "LlamaForCausalLM" in summary and "F32" in summary and "this checkpoint" in summary
    tab.shot("object-checkpoint")
    with tab.tab.expect_download() as info:
        tab.tab.click("#download")
    download = info.value
    assert download.suggested_filename == f"checkpoint-{oid.hex[:16]}.tar"
    with tarfile.open(fileobj=io.BytesIO(Path(download.path()).read_bytes())) as tar:
        names = sorted(m.name.partition("/")[2] for m in tar.getmembers())
    entries = demo.record(demo.record(oid)["files"])["entries"]
    assert names == sorted(entries)
    with tab.tab.expect_download() as info:
        tab.tab.locator("a.file-download").first.click()
    first = sorted(entries)[0]
    assert info.value.suggested_filename == first
    assert Path(info.value.path()).read_bytes() == demo.store.get_bytes(
        demo.store.resolve(entries[first]["id"]))


def test_compare_from_the_experiments_page(tab: Page, demo: Demo) -> None:
    seed, again = str(demo.receipt("eval-seed")), str(demo.receipt("eval-again"))
    tab.open("/?recipe=evaluate")
    tab.tab.check(f'input[name="run"][value="{seed}"]')
    tab.tab.check(f'input[name="run"][value="{again}"]')
    tab.tab.click("#compare-button")
    tab.tab.wait_for_url("**/compare?**")
    claims = {k: v["value"] for k, v in demo.record(again)["claims"].items()}
    assert tab.tab.inner_text("table.pairs td.wins") == str(claims["wins"])
    assert tab.tab.inner_text("table.pairs td.losses") == str(claims["losses"])
    tasks = demo.record(demo.output("prepare", "test"))
    assert tab.tab.locator("table.tasks tbody tr.task").count() == tasks["count"]
    tab.shot("compare")
    for table in ("table.runs", "table.tasks"):
        labels = tab.tab.locator(f"{table} thead th").all_inner_texts()
        assert len(labels) == len(set(labels)), labels
    checks = [[json.loads(x) for x in demo.store.get_bytes(demo.output(s, "checks")).decode()
               .splitlines()] for s in ("eval-seed", "eval-again")]
    all_wrong = sum(not a["correct"] and not b["correct"] for a, b in zip(*checks, strict=True))
    tab.tab.select_option('select[name="verdict"]', "all-wrong")
    tab.tab.click("#task-filters button[type=submit]")
    tab.tab.wait_for_url("**verdict=all-wrong**")
    assert tab.tab.locator("table.tasks tbody tr.task").count() == all_wrong
    assert re.match(rf"{all_wrong} of {tasks['count']} tasks", tab.tab.inner_text("#task-count"))


def test_object_previews(tab: Page, demo: Demo) -> None:
    records = demo.record(demo.output("prepare", "test"))["records"]
    tab.open(f"/object/{records}")
    assert tab.tab.locator("table.jsonl tbody tr").count() == demo.record(
        demo.output("prepare", "test"))["count"]
    tab.shot("object-jsonl")
    files = demo.record(demo.record(demo.output("init", "checkpoint"))["files"])
    weights = files["entries"]["model.safetensors"]["id"]
    tab.open(f"/object/{weights}")
    assert tab.tab.locator("table.tensors tbody tr").count() > 5
    assert tab.tab.get_attribute("#download", "href") == f"/raw/{weights}?download=1"
    tab.open(f"/object/{demo.output('init', 'checkpoint')}")
    assert "checkpoint/1" in tab.tab.inner_text("h1")
    tab.shot("object-record")


def test_a_hostile_store_runs_no_script(browser: Any, hostile_ui: Server, hostile: Hostile,
                                        screens: Path) -> None:
    from tests.ui.test_routes import hostile_pages

    page = Page(browser, hostile_ui.url, screens)
    try:
        for path in hostile_pages(hostile):
            response = page.open(path)
            assert response.status == 200, path
            page.tab.wait_for_timeout(50)
            assert page.tab.evaluate("window.__pwned") is None, path
            for frame in page.tab.frames:
                assert frame.evaluate("window.__pwned") is None, (path, frame.url)
        page.open(f"/object/{hostile.html}")
        frame = page.tab.locator("iframe.preview")
        assert frame.get_attribute("sandbox") == ""
        page.shot("hostile-html")
        page.open(f"/object/{hostile.svg}")
        assert page.tab.evaluate(
            "document.querySelector('img.preview').naturalWidth") == 40
        page.open(f"/receipt/{hostile.receipt}")
        assert "<script>window.__pwned=1</script>" in page.tab.inner_text("table.claims-table")
        page.shot("hostile-receipt")
    finally:
        page.close()
    # the only console errors: Chromium saying it blocked what the framed hostile page tried
    # (its script; its <img src=x>, a request from the frame's opaque origin, which the UI's
    # Cross-Origin-Resource-Policy refuses)
    blocked = [e for e in page.errors if "sandboxed" not in e and "allow-scripts" not in e
               and "ERR_BLOCKED_BY_RESPONSE.NotSameOrigin" not in e]
    assert blocked == [], blocked
