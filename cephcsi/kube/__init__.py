"""kube layer; see docs/ARCHITECTURE.md.

The Python counterpart of what client-go gives the Go sidecars. Modules (import them directly):
- client: ApiClient factory with client-side QPS/burst limiting and default timeouts.
- informer, store, factory: list+watch caches with handlers, indexes, resync; one per resource.
- workqueue, ratelimit, backoff: de-duplicating work queue, retry backoff, worker pool.
- leaselock, leaderelection: Lease-based leader election with fencing of leader-only loops.
- events: non-blocking, aggregating core/v1 Event recorder.
- apierrors: classify client errors and translate them to cephcsi.errors.
- metrics, clock: Prometheus metrics and time sources shared by the above.

No CSI, Ceph or sidecar imports here.
"""
