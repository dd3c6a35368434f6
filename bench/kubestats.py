"""Pure figures of the Kubernetes sections (4a, 4b): per-object latencies from event timelines,
burst throughput, Prometheus text, the client rate limiter's floor, Lease records and the failover
times leader election should give. No I/O here, so all of it has unit tests.
"""
from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from bench.stats import percentile

Predicate = Callable[[str, Mapping[str, Any]], bool]
"""(watch event type, object) → does the object show this state?"""


# ---- timelines from watch events -----------------------------------------------------------------

class Timeline:
    """The first time (monotonic seconds) each object reached each state, fed with watch events.

    `key` names the object an event is about (None: not ours, ignore it); `states` maps a state
    name to a predicate on (event type, object). Only the first time counts: a claim that is
    Bound stays Bound in every later MODIFIED event."""

    def __init__(self, key: Callable[[Mapping[str, Any]], str | None], states: Mapping[str, Predicate]) -> None:
        self.key = key
        self.states = dict(states)
        self.first: dict[str, dict[str, float]] = {state: {} for state in states}

    def record(self, event_type: str, obj: Mapping[str, Any], at: float) -> bool:
        """Apply one event; True when it marked a state for the first time."""
        name = self.key(obj)
        if name is None:
            return False
        marked = False
        for state, holds in self.states.items():
            if name not in self.first[state] and holds(event_type, obj):
                self.first[state][name] = at
                marked = True
        return marked

    def missing(self, state: str, names: Iterable[str]) -> list[str]:
        return sorted(n for n in names if n not in self.first[state])


def phase_is(phase: str) -> Predicate:
    return lambda event_type, obj: event_type != "DELETED" and (obj.get("status") or {}).get("phase") == phase


def has_annotation(*keys: str) -> Predicate:
    """The object carries one of these annotations (any value)."""
    return lambda event_type, obj: event_type != "DELETED" and any(
        k in ((obj.get("metadata") or {}).get("annotations") or {}) for k in keys)


def deleted(event_type: str, _obj: Mapping[str, Any]) -> bool:
    return event_type == "DELETED"


def exists(event_type: str, _obj: Mapping[str, Any]) -> bool:
    return event_type in ("ADDED", "MODIFIED")


def object_name(namespace: str | None = None) -> Callable[[Mapping[str, Any]], str | None]:
    """Key: metadata.name (of objects in `namespace` only, when given)."""
    def key(obj: Mapping[str, Any]) -> str | None:
        meta = obj.get("metadata") or {}
        if namespace is not None and meta.get("namespace") != namespace:
            return None
        return meta.get("name")
    return key


def claim_of_volume(namespace: str) -> Callable[[Mapping[str, Any]], str | None]:
    """Key for PersistentVolumes: the name of the claim in `namespace` they are (pre-)bound to."""
    def key(obj: Mapping[str, Any]) -> str | None:
        ref = (obj.get("spec") or {}).get("claimRef") or {}
        return ref.get("name") if ref.get("namespace") == namespace else None
    return key


# ---- bursts ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Burst:
    """N objects started at `started[name]`; how long until each, and all, reached a state."""

    count: int
    reached: int
    all_s: float | None
    """From the first start to the last object reaching the state (None if some never did)."""
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    """Per object: its own start → reached (nearest-rank percentiles)."""

    @property
    def per_second(self) -> float | None:
        return self.count / self.all_s if self.all_s else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_second": self.per_second}


def burst(started: Mapping[str, float], reached: Mapping[str, float]) -> Burst:
    """Figures of a burst: `started` holds every object, `reached` those that got there."""
    if not started:
        raise ValueError("a burst of no objects")
    lat = [reached[n] - t for n, t in started.items() if n in reached]
    done = len(lat)
    t0 = min(started.values())
    all_s = max(reached[n] for n in started if n in reached) - t0 if done == len(started) else None
    return Burst(
        count=len(started), reached=done, all_s=all_s,
        p50_s=percentile(lat, 50) if lat else None,
        p99_s=percentile(lat, 99) if lat else None,
        max_s=max(lat) if lat else None,
    )


@dataclass(frozen=True)
class Stage:
    name: str
    per_object: Burst
    """Each object's time from the previous stage (or its start) to this one."""
    last_s: float | None
    """From the first start until the last object reached this stage (None if some never did)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "per_object": self.per_object.to_json(), "last_s": self.last_s}


def stages(started: Mapping[str, float], marks: Iterable[tuple[str, Mapping[str, float]]]) -> list[Stage]:
    """Split each object's way into consecutive stages: `marks` are (stage name, {name: time
    reached}) in order. An object missing a mark has no latency for that stage or any later one."""
    if not started:
        raise ValueError("no objects")
    t0 = min(started.values())
    previous: dict[str, float] = dict(started)
    out = []
    for name, reached in marks:
        span = {n: previous[n] for n in started if n in previous}
        figures = burst(span, reached) if span else Burst(len(started), 0, None, None, None, None)
        figures = Burst(len(started), figures.reached, figures.all_s, figures.p50_s, figures.p99_s, figures.max_s)
        done = [reached[n] for n in started if n in reached and n in previous]
        out.append(Stage(name, figures, max(done) - t0 if len(done) == len(started) else None))
        previous = {n: reached[n] for n in span if n in reached}
    return out


# ---- Prometheus text (the controller's /metrics) ---------------------------------------------------

def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line; comments and malformed lines are skipped.
    Label values must not contain '",' (ours never do)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        try:
            number = float(value)
        except ValueError:
            continue
        name, brace, rest = series.partition("{")
        labels: dict[str, str] = {}
        if brace:
            for pair in rest.rstrip("}").split('",'):
                key, eq, val = pair.partition('="')
                if eq:
                    labels[key.strip().lstrip(",")] = val.rstrip('"')
        out.append((name, labels, number))
    return out


def metric_sum(samples: Iterable[tuple[str, dict[str, str], float]], metric: str, /, **labels: str) -> float:
    """Sum of every sample of `metric` whose labels include `labels` (0 when none); positional-only
    so a label may be called "name"."""
    return sum(v for n, ls, v in samples if n == metric and all(ls.get(k) == x for k, x in labels.items()))


def limiter_floor_s(requests: int | float, qps: float, burst_size: int) -> float:
    """Least time a token bucket (qps, burst) needs to let `requests` through from full."""
    if qps <= 0:
        return 0.0
    return max(0.0, (requests - burst_size) / qps)


# ---- leases and failover ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Lease:
    holder: str
    renew_time: datetime.datetime | None
    duration_s: int | None
    transitions: int


def parse_lease(doc: Mapping[str, Any] | None) -> Lease:
    """A coordination.k8s.io/v1 Lease as the API returns it (JSON), or an empty one for None."""
    spec = (doc or {}).get("spec") or {}
    renew = spec.get("renewTime")
    when = None
    if renew:
        when = datetime.datetime.fromisoformat(str(renew).replace("Z", "+00:00"))
    return Lease(holder=str(spec.get("holderIdentity") or ""), renew_time=when,
                 duration_s=spec.get("leaseDurationSeconds"), transitions=int(spec.get("leaseTransitions") or 0))


@dataclass(frozen=True)
class Timings:
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    jitter: float = 0.2
    """A standby waits retry_period × (1 + up to jitter) between polls (cephcsi.kube.leaderelection)."""

    def expected(self, kind: str) -> tuple[float, float]:
        """(low, high) seconds from the signal to the standby holding the Lease.

        graceful: the leader releases the Lease on SIGTERM, the standby takes it at its next poll:
        (0, retry × (1 + jitter)] after the release. sigkill: the last renewal happened up to one
        retry period before the kill, and the standby starts its lease_duration clock when it sees
        that renewal, up to one jittered poll later: lease − retry … lease + retry × (1 + jitter)."""
        poll = self.retry_period_s * (1 + self.jitter)
        if kind == "graceful":
            return 0.0, poll
        if kind == "sigkill":
            return self.lease_duration_s - self.retry_period_s, self.lease_duration_s + poll
        raise ValueError(f"unknown failover kind {kind!r}")

    def label(self) -> str:
        return (f"lease {self.lease_duration_s:g}s / renew {self.renew_deadline_s:g}s / "
                f"retry {self.retry_period_s:g}s")


def median(values: Iterable[float | None]) -> float | None:
    """Nearest-rank p50 of the values that are not None (None when there are none)."""
    present = [v for v in values if v is not None and not math.isnan(v)]
    return percentile(present, 50) if present else None


# ---- controller logs ---------------------------------------------------------------------------------

def problem_lines(log_text: str) -> list[str]:
    """Lines at WARNING or above of a cephcsi log: text format `<ts>Z W|E|C <logger> <msg>` or
    JSON lines with "level": "warning"|"error"|"critical"."""
    out = []
    for line in log_text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[0].endswith("Z") and parts[1] in ("W", "E", "C"):
            out.append(line)
        elif line.startswith("{") and any(f'"level": "{lvl}"' in line or f'"level":"{lvl}"' in line
                                          for lvl in ("warning", "error", "critical")):
            out.append(line)
    return out
