"""The numbers the docs quote are rerun, not trusted: bench/docs_numbers.py.

A number that moved is named with its file and line and rewritten on request;
every quote the script knows is still where it says in its document; and the
fast checks (the quickstart, chfl_tabular, the simulated CHFL cohort) rerun here
and must all hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import docs_numbers as dn  # noqa: E402

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("check", dn.CHECKS, ids=lambda c: c.name)
def test_every_quote_is_found_where_the_script_says(check):
    for q in check.quotes:
        found = dn.find(q, (ROOT / q.doc).read_text())
        dn.parse_number(found.text)  # a number, not some other text


def test_a_moved_number_is_named_with_its_line_and_rewritten(tmp_path, monkeypatch):
    doc = tmp_path / "page.md"
    doc.write_text("intro\n\n| run | acc | diff |\n|---|---|---|\n| a | 0.9356 | −1.24 (2/5) |\n"
                   "\nthe example gives 0.9709, the simulated number\n")
    monkeypatch.setattr(dn, "ROOT", tmp_path)
    check = dn.Check(
        "demo", "demo-command",
        lambda out: {"acc": 0.92, "diff": -0.0124, "count": 2, "sentence": 0.97089},
        [dn.Quote("page.md", "acc", row="a", column="acc"),
         dn.Quote("page.md", "diff", row="a", column="diff", pattern=dn.NUMBER + " ", scale=100),
         dn.Quote("page.md", "count", row="a", column="diff", pattern=r"\(" + dn.NUMBER + "/5"),
         dn.Quote("page.md", "sentence", pattern=r"gives " + dn.NUMBER)])
    result = dn.run_check(check, tmp_path, write=False)
    assert result.moved == ["page.md:5: acc: the doc says 0.9356, `demo-command` gives 0.9200"]
    assert result.same == 3 and not result.missing
    dn.run_check(check, tmp_path, write=True)
    assert "| a | 0.9200 | −1.24 (2/5) |" in doc.read_text()
    assert dn.run_check(check, tmp_path, write=False).moved == []


def test_a_quote_gone_from_its_page_is_reported_not_skipped(tmp_path, monkeypatch):
    (tmp_path / "page.md").write_text("nothing here\n")
    monkeypatch.setattr(dn, "ROOT", tmp_path)
    check = dn.Check("demo", "cmd", lambda out: {"x": 1.0}, [dn.Quote("page.md", "x", row="a", column="acc")])
    result = dn.run_check(check, tmp_path, write=False)
    assert result.missing and "acc" in result.missing[0]


def test_signs_and_precision_follow_the_quote():
    assert dn.parse_number("−1.24") == (-1.24, 2)
    assert dn.render(-0.0110, "−1.24") == "−0.01"
    assert dn.render(0.0233 * 100, "+2.33") == "+2.33"
    assert dn.render(0.18, "−2.03") == "+0.18"  # a difference that changed sign keeps showing it
    assert dn.render(0.92, "0.9356") == "0.9200"


@pytest.mark.e2e
def test_the_fast_documented_numbers_hold(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "docs_numbers.py"), "--fast",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " 0 moved" in proc.stdout
