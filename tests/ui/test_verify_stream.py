"""The verify button's stream: every check of the independent verification, in order, as the
verifiers make them, then the verdict; and the verifiers' progress callback behind it."""

from __future__ import annotations

import json

from nscas.verifiers.verify import exit_code, verify
from tests.ui.client import get
from tests.ui.conftest import Demo, Hostile


def events(body: bytes) -> list[dict]:
    out = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: "):
            out.append(json.loads(block.removeprefix("data: ")))
    return out


def test_progress_reports_every_check_in_order(demo: Demo) -> None:
    seen: list = []
    report = verify(str(demo.receipt("eval-again")), store=demo.store_dir, progress=seen.append)
    assert seen == list(report.checks) and len(seen) > 10


def test_stream_holds_the_report(demo: Demo) -> None:
    oid = demo.receipt("eval-again")
    r = get(demo.store_dir, f"/verify/{oid}")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    got = events(r.body)
    report = verify(str(oid), store=demo.store_dir)
    assert [e["check"] for e in got[:-1]] == [c.to_dict() for c in report.checks]
    assert got[-1] == {"done": {"ok": report.ok, "summary": report.summary(),
                                "exit_code": exit_code(report), "target": str(oid),
                                "named": None}}


def test_stream_of_a_forged_receipt_fails(hostile: Hostile) -> None:
    got = events(get(hostile.store_dir, f"/verify/{hostile.receipt}").body)
    assert got[-1]["done"]["ok"] is False and got[-1]["done"]["exit_code"] == 1
    assert any(e.get("check", {}).get("status") == "failed" for e in got)


def test_stream_of_nothing_is_404(demo: Demo) -> None:
    r = get(demo.store_dir, "/verify/blake3:" + "2" * 64)
    assert r.status == 404
