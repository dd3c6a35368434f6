"""Sampling profile of a running cephcsi process with py-spy (`--profile`), and a pure
reader of its collapsed stacks: which functions the samples were in (self) and under (total).

py-spy samples every thread of the process from outside (cProfile sees only the thread that
enabled it, and the controller serves on a gRPC thread pool). Samples are taken only of
threads that are running (not idle in a wait), `--nonblocking` so the process is not paused
per sample; a profiled run's latencies are still not the figures to quote, so `--profile` is a
separate run. py-spy comes from PyPI (`pip install py-spy`); without it `--profile` says so.
"""
from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("bench")


def py_spy() -> str | None:
    """The py-spy binary next to this interpreter, or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


@contextmanager
def recording(pid: int, output: Path, rate: int = 250, gil: bool = False) -> Iterator[Path | None]:
    """Record `pid` while the block runs; yields the collapsed-stack file (None without py-spy).
    gil=True samples only the thread holding the GIL: where the interpreter's own time goes."""
    binary = py_spy()
    if binary is None:
        log.warning("--profile: py-spy is not installed (pip install py-spy); not profiling")
        yield None
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([binary, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw",
                             "--nonblocking", *(["--gil"] if gil else []), "--output", str(output)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield output
    finally:
        proc.send_signal(signal.SIGINT)  # py-spy writes the file on Ctrl-C
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode not in (0, -signal.SIGINT, 130) or not output.exists():
            log.warning("py-spy exited %s: %s", proc.returncode, (err or b"").decode(errors="replace")[-500:])


@dataclass(frozen=True)
class Row:
    frame: str
    self_samples: int
    total_samples: int


def parse_collapsed(lines: Iterable[str]) -> list[tuple[list[str], int]]:
    """Collapsed stacks ('root;caller;callee 42', outermost first) → (frames, count)."""
    out = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        out.append((stack.split(";"), int(count)))
    return out


def frame_key(frame: str) -> str:
    """'func (path/to/module.py:123)' → 'func (module.py)': aggregate over line numbers."""
    name, _, where = frame.partition(" (")
    if not where:
        return frame
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({path.rsplit('/', 1)[-1]})" if path else name


def top(stacks: list[tuple[list[str], int]], key: str = "total", limit: int = 30) -> tuple[int, list[Row]]:
    """(all samples, rows sorted by `key` ('self' or 'total')): self = samples whose innermost
    frame is the function, total = samples with the function anywhere on the stack (once)."""
    self_c: Counter[str] = Counter()
    total_c: Counter[str] = Counter()
    samples = 0
    for frames, count in stacks:
        samples += count
        keys = [frame_key(f) for f in frames]
        if keys:
            self_c[keys[-1]] += count
        for k in set(keys):
            total_c[k] += count
    rows = [Row(k, self_c[k], total_c[k]) for k in total_c]
    rows.sort(key=lambda r: (r.self_samples if key == "self" else r.total_samples), reverse=True)
    return samples, rows[:limit]


def share_under(stacks: list[tuple[list[str], int]], needle: str) -> float:
    """Share of all samples with a frame containing `needle` on the stack (e.g. 'redact.py')."""
    samples = sum(c for _, c in stacks)
    hit = sum(c for frames, c in stacks if any(needle in f for f in frames))
    return hit / samples if samples else 0.0


def report_text(path: Path, limit: int = 40) -> str:
    stacks = parse_collapsed(path.read_text().splitlines())
    samples, by_total = top(stacks, "total", limit)
    _, by_self = top(stacks, "self", limit)
    lines = [f"{samples} samples (running threads only) from {path.name}", "", "by total (on the stack):"]
    lines += [f"  {r.total_samples / samples * 100:5.1f}%  {r.frame}" for r in by_total]
    lines += ["", "by self (innermost frame):"]
    lines += [f"  {r.self_samples / samples * 100:5.1f}%  {r.frame}" for r in by_self]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.profile FILE [N]`: print the top functions of a collapsed-stack file."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        print("usage: python -m bench.profile PROFILE.txt [N]", file=sys.stderr)
        return 2
    print(report_text(Path(args[0]), int(args[1]) if len(args) > 1 else 40), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
