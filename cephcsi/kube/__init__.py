"""kube layer; see docs/ARCHITECTURE.md.

The Python counterpart of what client-go gives the Go sidecars. Modules (import them directly):
- client: ApiClient factory with client-side QPS/burst limiting and default timeouts.
- informer, reflector, handlers, store, factory: list+watch caches with handlers, indexes,
  resync; one per resource (informer the cache API, reflector the list+watch loop, handlers
  the dispatch thread).
- workqueue, ratelimit, backoff: de-duplicating work queue, retry backoff, worker pool.
- leaselock, leaderelection: Lease-based leader election with fencing of leader-only loops.
- events: non-blocking, aggregating core/v1 Event recorder.
- errors: the layer's own exceptions (KubeError: ClientConfigError and the ApiError family).
- apierrors: classify client errors (ApiException, urllib3) into cephcsi.kube.errors; the
  sidecars translate those into cephcsi.errors at their boundary (cephcsi.sidecars.kubeerrors).
- metrics, clock: Prometheus metrics and time sources shared by the above.

No CSI, Ceph, sidecar or cephcsi.errors imports here (enforced in pyproject.toml).
"""
