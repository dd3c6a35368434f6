"""Which threads a process runs, by name: the Python threads from `py-spy dump` (their
threading names) and every OS thread from /proc/<pid>/task/*/comm, each counted by name with
its digits folded ("worker-12" and "worker-3" are "worker-#"), so a table shows what grows."""
from __future__ import annotations

import collections
import os
import re
import subprocess

from bench.profile import py_spy

_DUMP_THREAD = re.compile(r'^Thread (?:0x)?[0-9a-fA-F]+ \((?:[^)]*)\): "(.*)"\s*$')


def fold(name: str) -> str:
    """A thread name with each run of digits replaced by '#'."""
    return re.sub(r"\d+", "#", name)


def python_threads(dump_text: str) -> dict[str, int]:
    """{folded threading name: count} from the text of `py-spy dump`."""
    names = (fold(m.group(1)) for line in dump_text.splitlines() if (m := _DUMP_THREAD.match(line)))
    return dict(collections.Counter(names))


def os_threads(pid: int) -> dict[str, int]:
    """{folded /proc comm name: count} of every OS thread of `pid` ({} once it is gone)."""
    names = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as handle:
                    names.append(fold(handle.read().strip()))
            except OSError:
                continue
    except OSError:
        return {}
    return dict(collections.Counter(names))


def describe(pid: int) -> dict[str, dict[str, int]]:
    """{"os": ..., "python": ...} thread counts by name; "python" is {} without py-spy."""
    out = {"os": os_threads(pid), "python": {}}
    binary = py_spy()
    if binary:
        try:
            done = subprocess.run([binary, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True,
                                  text=True, timeout=30, check=False)
            out["python"] = python_threads(done.stdout)
        except (OSError, subprocess.TimeoutExpired):
            pass
    return out
