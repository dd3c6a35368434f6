"""The bench's report: cell formatting, text and Markdown tables, the JSON document."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import report
from bench.model import SectionResult, Table

pytestmark = pytest.mark.unit


def test_cell_formatting() -> None:
    assert report.ms(0.01234) == "12.3"
    assert report.ms(0.01234, 2) == "12.34"
    assert report.ms(None) == "—"
    assert report.rate(42.345) == "42.3"
    assert report.rate(321.7) == "322"
    assert report.rate(None) == "—"
    assert report.times(2.414) == "2.41×"
    assert report.times(None) == "—"
    assert report.mib(3 * 1024 * 1024 + 512 * 1024) == "3.5"
    assert report.num(1.2345, 2) == "1.23"
    assert report.num(None) == "—"


def _table() -> Table:
    t = Table(columns=["conc", "op", "p50", "ratio"], title="demo")
    t.add(1, "create", "12.3", "2.41×")
    t.add(32, "delete", "1234.5", "—")
    return t


def test_table_rows_must_match_columns() -> None:
    with pytest.raises(ValueError):
        _table().add("only one cell")


def test_text_table_aligns_numbers_right_and_words_left() -> None:
    lines = report.format_table(_table()).splitlines()
    assert lines[0] == "demo"
    header, rule, first, second = lines[1:]
    assert header.split() == ["conc", "op", "p50", "ratio"]
    assert set(rule.replace(" ", "")) == {"-"}
    assert first.startswith("1   ")  # first column left-aligned
    assert "create" in first and first.index("create") == second.index("delete")  # text left-aligned
    assert first.index("12.3") + len("12.3") == second.index("1234.5") + len("1234.5")  # numbers right-aligned
    assert first.endswith("2.41×") and second.endswith("—")
    assert all(len(line) <= len(rule) for line in lines[1:])


def test_markdown_table_marks_numeric_columns_and_escapes_pipes() -> None:
    t = _table()
    t.add(8, "a|b", "1.0", "1.00×")
    md = report.markdown_table(t).splitlines()
    assert md[0] == "*demo*"
    assert md[2] == "| conc | op | p50 | ratio |"
    assert md[3] == "|---|---|---:|---:|"  # first column always left
    assert "a\\|b" in md[-1]


def test_section_status_lines_and_notes() -> None:
    ok = SectionResult(name="a", title="A", tables=[_table()], notes=["hello"], seconds=12.4)
    pending = SectionResult(name="b", title="B", status="pending", reason="needs the embedded sidecars")
    text = report.format_text([ok, pending], {"nproc": 2, "kernel": "6.1"})
    assert "== A == (12 s)" in text
    assert "== B == pending: needs the embedded sidecars" in text
    assert "* hello" in text
    assert "nproc: 2" in text and "kernel: 6.1" in text
    md = report.format_markdown([ok, pending], {"nproc": 2})
    assert "#### B — pending: needs the embedded sidecars" in md
    assert "nproc=2" in md


def test_json_document_round_trips_and_latest_files_are_written(tmp_path: Path) -> None:
    result = SectionResult(name="a", title="A", tables=[_table()], data={"p50_s": 0.01}, seconds=1.23456)
    doc = report.document([result], {"nproc": 2}, {"ops": 8})
    path = report.write_outputs(tmp_path, "20260101T000000Z", doc, "text\n", "md\n")
    assert path == tmp_path / "bench-20260101T000000Z.json"
    loaded = json.loads(path.read_text())
    assert loaded["schema"] == 1
    assert loaded["machine"] == {"nproc": 2} and loaded["options"] == {"ops": 8}
    section = loaded["sections"][0]
    assert section["seconds"] == 1.235
    assert section["tables"][0]["rows"][0] == ["1", "create", "12.3", "2.41×"]
    assert json.loads((tmp_path / "latest.json").read_text()) == loaded
    assert (tmp_path / "latest.txt").read_text() == "text\n"
    assert (tmp_path / "bench-20260101T000000Z.md").read_text() == "md\n"
    assert not list(tmp_path.glob("*.tmp"))
