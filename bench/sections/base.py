"""A benchmark section: a name for --sections, a title for the report, and a run function."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.environment import Environment
from bench.model import SectionResult


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    run: Callable[[Environment], SectionResult]


def pending(name: str, title: str, reason: str, planned: list[str]) -> Section:
    """A slot for figures that cannot be measured yet; prints `pending: <reason>`."""

    def run(env: Environment) -> SectionResult:
        return SectionResult(name=name, title=title, status="pending", reason=reason,
                             notes=[f"planned: {item}" for item in planned])

    return Section(name=name, title=title, run=run)
