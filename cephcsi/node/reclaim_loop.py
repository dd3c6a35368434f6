"""The node plugin's reclaim-space pass: trims the staged volumes whose claim the controller
leader has recorded a run on since this node last trimmed them. docs/reclaim-space.md.

A failed trim counts as honoured (not retried before the next recorded run); a busy volume is
tried next pass. What was honoured is kept in `<state-dir>/reclaim-trims.json`. Why the node
follows the leader's record: docs/design/node.md, "Following the leader's record".
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping
from datetime import datetime

from cephcsi.errors import CephCSIError, OperationInFlight
from cephcsi.locks import KeyLocks
from cephcsi.node import exec as node_exec, reclaim, stage_record
from cephcsi.node.staged_volumes import stage_records
from cephcsi.observability.logging import fields
from cephcsi.volumes.reclaim import format_time, parse_time

log = logging.getLogger(__name__)

STATE_FILE = "reclaim-trims.json"

Requests = Callable[[list[stage_record.StageRecord]], Mapping[str, datetime]]
"""Volume id → the claim's recorded run, for the records given (absent: no run recorded)."""


def staged_records(kubelet_dir: str, driver_name: str) -> list[stage_record.StageRecord]:
    """The stage records of this driver on this node that a trim applies to (Block volumes are
    never trimmed on the node)."""
    return [record for record in stage_records(kubelet_dir, driver_name, block=False, skipped="volume not trimmed")
            if not reclaim.why_not(record)]


class TrimState:
    """Per volume id, the last claim run this node trimmed for."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, STATE_FILE)

    def load(self) -> dict[str, datetime]:
        try:
            with open(self.path, encoding="utf-8") as handle:
                doc = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            log.warning("reclaim state unreadable; every requested trim runs again",
                        extra=fields(path=self.path, error=str(error)))
            return {}
        result = {}
        for volume_id, text in (doc.items() if isinstance(doc, dict) else []):
            moment = parse_time(str(text))
            if moment is not None:
                result[str(volume_id)] = moment
        return result

    def save(self, state: Mapping[str, datetime]) -> None:
        directory = os.path.dirname(self.path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".reclaim-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({k: format_time(v) for k, v in sorted(state.items())}, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


class NodeTrimPass:
    def __init__(self, kubelet_dir: str, driver_name: str, state_dir: str, locks: KeyLocks,
                 runner: node_exec.Runner, requests: Requests, interval: float,
                 trim_timeout: float = reclaim.TRIM_TIMEOUT) -> None:
        self.kubelet_dir = kubelet_dir
        self.driver_name = driver_name
        self.state = TrimState(state_dir)
        self.locks = locks
        self.runner = runner
        self.trim_timeout = trim_timeout
        self.requests = requests
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="reclaim-trim", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.run_once()
            except Exception as error:  # noqa: BLE001 - a failed pass must not end the loop
                log.error("reclaim-space pass failed", extra=fields(error=str(error)))

    def run_once(self) -> list[reclaim.TrimResult]:
        records = staged_records(self.kubelet_dir, self.driver_name)
        if not records:
            return []
        requested = self.requests(records)
        state = self.state.load()
        results = []
        for record in records:
            wanted = requested.get(record.volume_id)
            done = state.get(record.volume_id)
            if wanted is None or (done is not None and done >= wanted):
                continue
            result = self._trim(record)
            if result is None:
                continue
            results.append(result)
            state[record.volume_id] = wanted
            self.state.save(state)
        return results

    def _trim(self, record: stage_record.StageRecord) -> reclaim.TrimResult | None:
        try:
            with self.locks.hold(record.volume_id):
                current = stage_record.load(record.staging_path)
                if current is None or current.volume_id != record.volume_id:
                    return None  # unstaged meanwhile
                try:
                    return reclaim.trim(current, self.runner, self.trim_timeout)
                except CephCSIError as error:  # fstrim failed or timed out: recorded, not retried
                    return reclaim.failed(record.volume_id, error.message)
        except OperationInFlight:
            log.info("volume busy; trim on the next pass", extra=fields(volume_id=record.volume_id))
            return None
