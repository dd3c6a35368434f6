"""Prometheus metrics of the Kubernetes machinery.

They are module-level objects registered once in prometheus_client's default registry when this
module is first imported (Python imports a module once per process), and labelled by queue,
informer or lease name so any number of instances share them. Names follow client-go's where
one exists (workqueue_*, leader_election_master_status, rest_client_*), so dashboards written
for the Go sidecars keep working. The metrics issue exposes the default registry on /metrics.
"""
from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 150, 300, 600)

WORKQUEUE_DEPTH = Gauge("workqueue_depth", "Keys waiting in the work queue.", ["name"])
WORKQUEUE_ADDS = Counter("workqueue_adds", "Keys added to the work queue.", ["name"])
WORKQUEUE_RETRIES = Counter("workqueue_retries", "Rate-limited re-adds (failed keys).", ["name"])
WORKQUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds", "Time spent processing one key.", ["name"],
    buckets=_DURATION_BUCKETS,
)
WORKQUEUE_QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds", "Time a key waited in the queue before a worker took it.",
    ["name"], buckets=_DURATION_BUCKETS,
)

LEADER_STATUS = Gauge(
    "leader_election_master_status", "1 while this process holds the lease, else 0.", ["name"]
)

INFORMER_LISTS = Counter("cephcsi_informer_lists", "Full lists (initial and relists).", ["name"])
INFORMER_WATCHES = Counter("cephcsi_informer_watches", "Watch requests started.", ["name"])
INFORMER_WATCH_ERRORS = Counter(
    "cephcsi_informer_watch_errors", "Watches that ended with an error, by kind.", ["name", "reason"]
)
INFORMER_ITEMS = Gauge("cephcsi_informer_items", "Objects in the informer cache.", ["name"])

CLIENT_REQUESTS = Counter(
    "rest_client_requests", "Requests to the API server by method and HTTP code.", ["method", "code"]
)
CLIENT_THROTTLE = Histogram(
    "rest_client_rate_limiter_duration_seconds", "Time a request waited for the client rate limiter.",
    ["method"], buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
)

EVENTS_SENT = Counter("cephcsi_events_sent", "Events written to the API, by action.", ["action"])
EVENTS_DROPPED = Counter("cephcsi_events_dropped", "Events not written, by reason.", ["reason"])
