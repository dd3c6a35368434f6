"""What every section hands back: status, printable tables, notes and raw numbers for the JSON."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["ok", "skipped", "pending", "failed"]


@dataclass
class Table:
    """A printable table; cells are already formatted strings."""

    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    title: str = ""

    def add(self, *cells: object) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"row has {len(cells)} cells, table {self.title!r} has {len(self.columns)} columns")
        self.rows.append([str(c) for c in cells])

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns), "rows": [list(r) for r in self.rows]}


@dataclass
class SectionResult:
    name: str
    title: str
    status: Status = "ok"
    reason: str = ""
    """Why the section was skipped, pending or failed (empty when ok)."""
    tables: list[Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    """Raw numbers (seconds, bytes) for the JSON file."""
    seconds: float = 0.0
    """How long the section took to run."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
            "tables": [t.to_json() for t in self.tables],
            "data": self.data,
        }
