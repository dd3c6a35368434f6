"""Turn section results into a text table for the terminal, Markdown for the README, and JSON."""
from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.model import SectionResult, Table
from bench.stats import within

_NUMERIC = re.compile(r"^[-+]?[\d.,]+\s*(?:[a-zA-Z%×/]+)?(?:\s*\([\d.,]+[–-][\d.,]+\))?$"
                      r"|^[\d.,]+[–-][\d.,]+$|^—$|^n/a$")

MiB = 1 << 20


# ---- cell formatting -----------------------------------------------------------------------------

def ms(seconds: float | None, digits: int = 1) -> str:
    """Seconds → milliseconds text ('—' for None)."""
    return "—" if seconds is None else f"{seconds * 1000:.{digits}f}"


def num(value: float | None, digits: int = 1) -> str:
    """A plain number with `digits` decimals ('—' for None)."""
    return "—" if value is None else f"{value:.{digits}f}"


def rate(ops_per_s: float | None) -> str:
    """Operations per second; one decimal below 100, none above."""
    if ops_per_s is None:
        return "—"
    return f"{ops_per_s:.1f}" if ops_per_s < 100 else f"{ops_per_s:.0f}"


def times(value: float | None) -> str:
    """A ratio as '2.41×' ('—' when undefined)."""
    return "—" if value is None else f"{value:.2f}×"


def times_spread(s: Any) -> str:
    """A ratio's median over rounds with its min–max: '1.32× (1.20–1.45)' ('—' for None)."""
    if s is None:
        return "—"
    return f"{s.median:.2f}× ({s.low:.2f}–{s.high:.2f})"


def spread_range(s: Any, scale: float = 1.0, digits: int = 1) -> str:
    """min–max of a figure over rounds ('—' for None), e.g. '4.1–5.3'."""
    if s is None:
        return "—"
    return f"{s.low * scale:.{digits}f}–{s.high * scale:.{digits}f}"


def verdict(s: Any, target: float, at_most: bool = True) -> str:
    """'1.32× (1.20–1.45) met' — met when the median meets the target; 'met, spread crosses'
    when the median does but the worst round does not."""
    if s is None:
        return "— (not measured)"
    ok = within(s.median, target, at_most)
    worst = s.high if at_most else s.low
    all_ok = within(worst, target, at_most)
    word = "met" if ok and all_ok else ("met, spread crosses" if ok else "NOT met")
    return f"{times_spread(s)} {word}"


def mib(num_bytes: int | float | None) -> str:
    """Bytes → MiB with one decimal ('—' for None)."""
    return "—" if num_bytes is None else f"{num_bytes / MiB:.1f}"


# ---- tables -------------------------------------------------------------------------------------------

def _is_numeric(cell: str) -> bool:
    return bool(_NUMERIC.match(cell.strip()))


def format_table(table: Table) -> str:
    """Fixed-width text: first column left-aligned, numeric-looking cells right-aligned."""
    widths = [len(c) for c in table.columns]
    for row in table.rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str], header: bool = False) -> str:
        out = []
        for i, cell in enumerate(cells):
            right = i > 0 and (header or _is_numeric(cell))
            out.append(cell.rjust(widths[i]) if right else cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    lines = []
    if table.title:
        lines.append(table.title)
    lines.append(line(table.columns, header=True))
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(line(row) for row in table.rows)
    return "\n".join(lines)


def markdown_table(table: Table) -> str:
    """A GitHub Markdown table (numeric columns right-aligned); pipes in cells are escaped."""

    def esc(cell: str) -> str:
        return cell.replace("|", "\\|")

    numeric = [
        i > 0 and bool(table.rows) and all(_is_numeric(row[i]) for row in table.rows)
        for i in range(len(table.columns))
    ]
    lines = []
    if table.title:
        lines.append(f"*{table.title}*")
        lines.append("")
    lines.append("| " + " | ".join(esc(c) for c in table.columns) + " |")
    lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    lines.extend("| " + " | ".join(esc(c) for c in row) + " |" for row in table.rows)
    return "\n".join(lines)


def _status_line(result: SectionResult) -> str:
    if result.status == "ok":
        return f"({result.seconds:.0f} s)"
    return f"{result.status}: {result.reason}" if result.reason else result.status


def format_machine(machine: Mapping[str, Any]) -> str:
    keys = ("date", "hostname", "os", "kernel", "cpu_model", "nproc", "memory_total", "ceph_version",
            "python_version", "cephcsi_commit", "loadavg_start", "loadavg_end")
    parts = [f"{k}: {machine[k]}" for k in keys if k in machine and machine[k] not in (None, "")]
    return "\n".join(parts)


def format_text(results: Sequence[SectionResult], machine: Mapping[str, Any]) -> str:
    blocks = ["== machine ==", format_machine(machine)]
    for result in results:
        blocks.append("")
        blocks.append(f"== {result.title} == {_status_line(result)}")
        for table in result.tables:
            blocks.append(format_table(table))
            blocks.append("")
        blocks.extend(f"* {note}" for note in result.notes)
    return "\n".join(blocks).rstrip() + "\n"


def format_markdown(results: Sequence[SectionResult], machine: Mapping[str, Any]) -> str:
    lines = ["Machine: " + "; ".join(
        f"{k}={machine[k]}" for k in ("date", "kernel", "cpu_model", "nproc", "memory_total", "ceph_version",
                                      "python_version", "cephcsi_commit", "loadavg_start", "loadavg_end")
        if machine.get(k) not in (None, "")
    ), ""]
    for result in results:
        lines.append(f"#### {result.title} — {_status_line(result)}")
        lines.append("")
        for table in result.tables:
            lines.append(markdown_table(table))
            lines.append("")
        for note in result.notes:
            lines.append(f"- {note}")
        if result.notes:
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def document(results: Sequence[SectionResult], machine: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON document written under bench/results/."""
    return {
        "schema": 1,
        "machine": dict(machine),
        "options": dict(options),
        "sections": [r.to_json() for r in results],
    }


def write_outputs(directory: Path, stamp: str, doc: Mapping[str, Any], text: str, markdown: str) -> Path:
    """Write <stamp>.json/.txt/.md and refresh latest.*; returns the JSON path."""
    directory.mkdir(parents=True, exist_ok=True)
    base = directory / f"bench-{stamp}"
    json_path = base.with_suffix(".json")
    payload = json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n"
    for path, content in ((json_path, payload), (base.with_suffix(".txt"), text), (base.with_suffix(".md"), markdown)):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(content)
        os.replace(tmp, path)
        latest = directory / f"latest{path.suffix}"
        tmp_latest = latest.with_name(latest.name + ".tmp")
        tmp_latest.write_text(content)
        os.replace(tmp_latest, latest)
    return json_path
