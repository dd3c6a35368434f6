"""bench/scale_threads.py: thread names from py-spy dump and /proc, digits folded."""
from __future__ import annotations

import os
import threading

import pytest

from bench import scale_threads

pytestmark = pytest.mark.unit

DUMP = '''Process 4242: /work/main/.venv/bin/python -m cephcsi --mode=controller
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    wait (threading.py:331)
Thread 0x7F3A2B1C0640 (idle): "worker-attacher-3"
    get (cephcsi/kube/workqueue.py:120)
Thread 4250 (active): "worker-attacher-12"
    _process (cephcsi/sidecars/attacher/loop.py:150)
Thread 4251 (idle): "informer-persistent_volume-watch"
'''


def test_python_threads_are_counted_by_folded_name() -> None:
    assert scale_threads.python_threads(DUMP) == {
        "MainThread": 1, "worker-attacher-#": 2, "informer-persistent_volume-watch": 1}


def test_os_threads_of_this_process_include_a_named_one() -> None:
    started = threading.Event()
    release = threading.Event()

    def body() -> None:
        started.set()
        release.wait(10)

    thread = threading.Thread(target=body)
    thread.start()
    try:
        started.wait(10)
        counts = scale_threads.os_threads(os.getpid())
        assert sum(counts.values()) >= 2
    finally:
        release.set()
        thread.join()
    assert scale_threads.os_threads(2**22 + 7) == {}
